// `relay data inspect`: validates a training file exactly as training would and describes it.
#pragma once
#include <string>

namespace relay {

// Lists every dataset (shape, dtype) and root attribute, then N, D, the target kind and either the
// class range with per-class counts or K. The target kind follows /targets' dtype (integer: class
// indices, float: dense). Throws relay::Error naming the file and dataset if training would reject it.
std::string inspect_dataset(const std::string& path);

}  // namespace relay
