// Umbrella header: everything public in attn.
#pragma once

#include "attn/dtype.hpp"
#include "attn/error.hpp"
#include "attn/npy.hpp"
#include "attn/reference.hpp"
#include "attn/sdpa.hpp"
#include "attn/tensor.hpp"
#include "attn/version.hpp"
