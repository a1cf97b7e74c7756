// Hugging Face model directories as files: config.json and safetensors shards, read and written without
// knowing which model they hold.
#include "io/hf_dir.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace relay {

namespace {

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  f << text << "\n";
  f.flush();
  if (!f) throw Error(cat("--out: cannot write ", path.string(), ": ", std::strerror(errno)));
}

}  // namespace

void write_hf_files(const std::string& dir, const nlohmann::ordered_json& config,
                    const std::vector<CheckpointTensor>& tensors, bool bf16,
                    const std::map<std::string, std::string>& metadata, const std::string& where) {
  std::error_code ec;
  if (fs::exists(dir) && !(fs::is_directory(dir) && fs::is_empty(dir, ec)))
    throw Error(cat(where, ": exists and is not an empty directory; choose a new one"));
  // Everything goes into DIR.tmp-PID, renamed to DIR at the end: no half directory on failure.
  fs::path target = fs::path(dir).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();  // "out/" -> "out": the temporary is a sibling
  const fs::path tmp = cat(target.string(), ".tmp-", ::getpid());
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec) || ec)
    throw Error(cat(where, ": cannot create ", tmp.string(), ": ", ec.message()));
  try {
    write_text(tmp / "config.json", config.dump(2));
    nlohmann::ordered_json gen = {{"_from_model_config", true}, {"bos_token_id", config["bos_token_id"]},
                                  {"eos_token_id", config["eos_token_id"]}};
    write_text(tmp / "generation_config.json", gen.dump(2));
    write_safetensors((tmp / "model.safetensors").string(), tensors, metadata, bf16 ? "BF16" : "F32");
    if (fs::exists(target)) fs::remove(target);  // the empty directory checked above
    fs::rename(tmp, target, ec);
    if (ec) throw Error(cat(where, ": cannot rename ", tmp.string(), " into place: ", ec.message()));
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

bool is_hf_dir(const std::string& path) { return fs::is_directory(path); }

namespace {

json read_json(const fs::path& path, const std::string& where) {
  std::ifstream f(path);
  if (!f) throw Error(cat(where, ": cannot read ", path.filename().string()));
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    throw Error(cat(where, ": ", path.filename().string(), " is not valid JSON (", e.what(), ")"));
  }
}

}  // namespace

HfDir::HfDir(const std::string& dir, const std::string& where) : dir_(dir), where_(where) {
  const fs::path d(dir);
  if (!fs::exists(d / "config.json"))
    throw Error(cat(where, ": the directory has no config.json (not a Hugging Face model directory)"));
  config_ = read_json(d / "config.json", where);
  if (!config_.is_object()) throw Error(cat(where, ": config.json is not a JSON object"));
  std::vector<std::string> names;  // the safetensors files, in the index's order
  if (fs::exists(d / "model.safetensors.index.json")) {
    const json index = read_json(d / "model.safetensors.index.json", where);
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      throw Error(cat(where, ": model.safetensors.index.json has no \"weight_map\" object"));
    for (auto& [tensor, file] : index["weight_map"].items()) {
      if (!file.is_string())
        throw Error(cat(where, ": model.safetensors.index.json: weight_map[\"", tensor, "\"] is not a file name"));
      if (std::find(names.begin(), names.end(), file.get<std::string>()) == names.end())
        names.push_back(file.get<std::string>());
    }
  } else if (fs::exists(d / "model.safetensors")) {
    names.push_back("model.safetensors");
  } else {
    throw Error(cat(where, ": the directory has neither model.safetensors nor model.safetensors.index.json "
                           "(Relay reads safetensors weights, not pytorch_model.bin)"));
  }
  for (auto& name : names) {
    if (!fs::exists(d / name))
      throw Error(cat(where, ": model.safetensors.index.json names ", name, ", which the directory does not hold"));
    files_.push_back(std::make_unique<SafetensorsFile>((d / name).string()));
    for (auto& e : files_.back()->entries()) {
      file_of_[e.name] = files_.size() - 1;
      shapes_[e.name] = e.shape;
    }
  }
}

void HfDir::read(const std::string& name, const Shape& shape, float* out) const {
  auto it = file_of_.find(name);
  if (it == file_of_.end()) throw Error(cat(where_, ": tensor ", name, " is missing from the directory"));
  files_[it->second]->read(name, shape, out);
}

}  // namespace relay
