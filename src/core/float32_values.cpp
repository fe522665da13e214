#include "float32_values.hpp"

#include <cmath>
#include <cstdint>
#include <string>

#include "attn/error.hpp"
#include "check.hpp"

namespace attn::detail {

Tensor float32_values(const TensorView& values, std::string_view name) {
    if (!is_floating(values.dtype())) {
        throw Error(std::string(name) + ": dtype must be floating (float32, float64, float16 or bfloat16) but got " +
                        std::string(dtype_name(values.dtype())),
                    ErrorKind::type);
    }
    Tensor out = to_dtype(values, DType::f32);
    const float* rounded = out.data_as<const float>();
    // to_dtype's order: row-major over the view's shape, element k of `out`.
    const Shape& s = values.shape();
    for (std::int64_t k = 0; k < out.numel(); ++k) {
        if (!std::isinf(rounded[k])) continue;
        std::int64_t index[kMaxRank] = {};
        for (std::int64_t rest = k, d = s.rank - 1; d >= 0; --d) {
            index[d] = rest % s[static_cast<int>(d)];
            rest /= s[static_cast<int>(d)];
        }
        const double given = values.load_as_double(values.offset(index[0], index[1], index[2], index[3]));
        if (std::isinf(given)) continue;  // an inf as given: the caller's check names it
        std::string where;
        for (int d = 0; d < s.rank; ++d) where += (d ? ", " : "") + std::to_string(index[d]);
        throw Error(std::string(name) + "[" + where + "] = " + shortest(given) +
                    " does not fit float32 (it rounds to " + (given < 0 ? "-inf" : "inf") +
                    "; float32's largest magnitude is 3.4028235e+38)");
    }
    return out;
}

}  // namespace attn::detail
