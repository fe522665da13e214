// The benchmark's output: a readable table on stdout, streamed case by case, and the same
// data as JSON (schema "attn-bench/1", read by scripts/bench-to-markdown.py and the tests).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness.hpp"

namespace attn::bench {

struct Report {
    MachineInfo machine;
    std::string command;
    std::string loadavg_end;  // /proc/loadavg when the measurements ended
    Config cfg;
    Ceilings ceilings;
    std::string torch_version, torch_note;
    std::vector<CaseResult> cases;
};

void print_header(const Report& r);
void print_ceilings(const Report& r);
void print_case(const Context& ctx, const CaseResult& c);
nlohmann::json to_json(const Report& r);

}  // namespace attn::bench
