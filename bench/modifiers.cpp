#include "modifiers.hpp"

#include <sstream>

#include "attn/error.hpp"

namespace attn::bench {

void set_modifiers(const std::string& name, std::int64_t Hq, SdpaOptions& opt, ModifierTensors& keep) {
    std::istringstream parts(name);
    std::string part;
    while (std::getline(parts, part, '+')) {
        if (part == "softcap") {
            opt.softcap = 50.0;
        } else if (part == "alibi") {
            keep.alibi = alibi_slopes(Hq);
            opt.alibi_slopes = keep.alibi.view();
        } else if (part == "sinks") {
            keep.sinks = Tensor(DType::f32, Shape{Hq});
            for (std::int64_t h = 0; h < Hq; ++h) keep.sinks.data_as<float>()[h] = 0.5f;
            opt.sinks = keep.sinks.view();
        } else {
            throw Error("bench: unknown score modifier '" + part + "' in '" + name + "'");
        }
    }
}

}  // namespace attn::bench
