// relay data synth | inspect
#include <cstdio>

#include "cli/commands.hpp"
#include "io/inspect.hpp"
#include "io/synth.hpp"

namespace relay {

CLI::App* add_data_command(CLI::App& app, DataOptions& o, CLI::App** synth, CLI::App** inspect) {
  auto* d = app.add_subcommand("data", "Make or check HDF5 datasets");
  d->require_subcommand(1);
  auto* s = d->add_subcommand("synth", "Write a learnable synthetic classification set (labels from a fixed random teacher MLP)");
  s->add_option("--out", o.out, "Output HDF5 file")->required();
  s->add_option("--samples", o.samples, "Number of samples N")->required();
  s->add_option("--features", o.features, "Input features D")->required();
  s->add_option("--classes", o.classes, "Number of classes C")->required();
  s->add_option("--seed", o.seed, "Seed of the samples")->required();
  s->add_option("--teacher-seed", o.teacher_seed, "Seed of the teacher network (train and eval sets share it)")
      ->capture_default_str();
  auto* i = d->add_subcommand("inspect", "Validate a dataset and print its datasets, shapes and dtypes");
  i->add_option("file", o.file, "HDF5 file")->required();
  *synth = s;
  *inspect = i;
  return d;
}

int run_data_synth(const DataOptions& o) {
  write_synthetic_classification(o.out, o.samples, o.features, o.classes, o.seed, o.teacher_seed);
  std::printf("wrote %s: %lld samples, %lld features, %lld classes (seed %llu, teacher seed %llu)\n", o.out.c_str(),
              static_cast<long long>(o.samples), static_cast<long long>(o.features), static_cast<long long>(o.classes),
              static_cast<unsigned long long>(o.seed), static_cast<unsigned long long>(o.teacher_seed));
  return 0;
}

int run_data_inspect(const DataOptions& o) {
  std::printf("%s", inspect_dataset(o.file).c_str());
  return 0;
}

}  // namespace relay
