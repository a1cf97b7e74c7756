// The source tree's layering (CMakeLists.txt): core -> kernels -> backend -> comm, io -> model (and optim) ->
// parallel -> train -> plan -> cli. A file may include its own layer's headers and those of the layers below it,
// never one above (an arrow pointing up), and comm and io, side by side, not each other.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

// A layer's height; layers of one height must not include each other unless they are one library (model, optim).
const std::map<std::string, int> kHeight = {{"core", 0},  {"kernels", 1},  {"backend", 2}, {"comm", 3},
                                            {"io", 3},    {"model", 4},    {"optim", 4},   {"parallel", 5},
                                            {"train", 6}, {"plan", 7},     {"cli", 8}};

bool same_library(const std::string& a, const std::string& b) {
  return a == b || (a == "model" && b == "optim") || (a == "optim" && b == "model");
}

// The layer of a source file relative to the checkout: src/<layer>/..., io/..., kernels/...
std::string layer_of(const fs::path& rel) {
  auto it = rel.begin();
  const std::string first = it->string();
  if (first != "src") return first;
  return (++it)->string();
}

struct Include {
  std::string file;
  int line;
  std::string text;
};

std::vector<Include> upward_includes() {
  const fs::path root = RELAY_SOURCE_DIR;
  const std::regex include(R"(^\s*#\s*include\s+"([a-z_]+)/)");
  std::vector<Include> bad;
  for (const char* top : {"src", "io", "kernels"}) {
    for (const auto& e : fs::recursive_directory_iterator(root / top)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cpp" && ext != ".hpp" && ext != ".cu" && ext != ".cuh")) continue;
      const fs::path rel = fs::relative(e.path(), root);
      const std::string from = layer_of(rel);
      if (!kHeight.count(from)) continue;
      std::ifstream in(e.path());
      std::string line;
      for (int n = 1; std::getline(in, line); ++n) {
        std::smatch m;
        if (!std::regex_search(line, m, include)) continue;
        const std::string to = m[1];
        if (!kHeight.count(to) || same_library(from, to)) continue;
        if (kHeight.at(to) >= kHeight.at(from)) bad.push_back({rel.string(), n, line});
      }
    }
  }
  return bad;
}

}  // namespace

TEST(SourceLayout, NoIncludePointsUp) {
  const std::vector<Include> bad = upward_includes();
  for (const Include& b : bad)
    ADD_FAILURE() << b.file << ":" << b.line << ": " << b.text << "  (a lower layer includes a higher or sibling one)";
  EXPECT_TRUE(bad.empty());
}

TEST(SourceLayout, TheCheckSeesTheTree) {
  // The walk must find the layers it checks (a moved tree would otherwise pass vacuously).
  const fs::path root = RELAY_SOURCE_DIR;
  for (const char* dir : {"src/core", "src/model", "src/parallel", "src/plan", "src/cli", "io", "kernels/cpu"})
    EXPECT_TRUE(fs::is_directory(root / dir)) << dir;
  EXPECT_EQ(layer_of("src/model/families/gpt2.cpp"), "model");
  EXPECT_EQ(layer_of("kernels/cpu/matmul.cpp"), "kernels");
}
