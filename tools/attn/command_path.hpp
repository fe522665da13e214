// The file a command name runs: `attn bench` starts --python through the shell, so a bare name
// ("python3") is the first executable of that name on PATH, not a file of that name in the
// current directory. OutputFiles compares an output with the file that will actually run.
#pragma once

#include <string>

namespace attn::cli {

// `name` itself when it holds a '/'; else dir/name for the first directory of PATH (an empty
// entry: the current directory; PATH unset: the system's default path, as execvp) where it is
// an executable regular file; else "" (nothing of that name would run).
std::string command_path(const std::string& name);

}  // namespace attn::cli
