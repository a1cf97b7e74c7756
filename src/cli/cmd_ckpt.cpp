// relay ckpt inspect FILE: step, layout and tensors of a checkpoint, after checking it is complete
// and that every tensor reads back.
#include <cstdio>
#include <vector>

#include "cli/commands.hpp"
#include "io/checkpoint.hpp"

namespace relay {

CLI::App* add_ckpt_command(CLI::App& app, CkptOptions& o, CLI::App** inspect) {
  auto* c = app.add_subcommand("ckpt", "Work with checkpoints");
  c->require_subcommand(1);
  auto* i = c->add_subcommand("inspect", "Print a checkpoint's step, layout and tensors; check it is complete");
  i->add_option("file", o.file, "Checkpoint file (step_XXXXXXXX.h5)")->required();
  *inspect = i;
  return c;
}

int run_ckpt_inspect(const CkptOptions& o) {
  CheckpointReader r(o.file);
  const auto& m = r.meta();
  std::printf("checkpoint %s\n  format relay-checkpoint v%d, step %lld, complete\n", o.file.c_str(), kCheckpointVersion,
              static_cast<long long>(m.step));
  std::printf("  written under dp = %lld, pp = %lld, schedule = %s, virtual_stages = %lld\n",
              static_cast<long long>(m.dp), static_cast<long long>(m.pp), m.schedule.c_str(),
              static_cast<long long>(m.virtual_stages));
  std::printf("  optimizer %s, %lld updates; data position %lld (epoch %lld of %lld samples, batch %lld)\n",
              m.optimizer.c_str(), static_cast<long long>(m.optimizer_step), static_cast<long long>(m.position),
              static_cast<long long>(m.epoch), static_cast<long long>(m.samples), static_cast<long long>(m.batch_size));
  int64_t total = 0;
  std::vector<float> buf;
  auto tensors = r.tensors();
  std::printf("  %zu tensors:\n", tensors.size());
  for (auto& [name, shape] : tensors) {
    buf.resize(static_cast<size_t>(shape_numel(shape)));
    r.read(name, shape, buf.data());  // every byte must read back
    total += shape_numel(shape);
    std::printf("    %-40s %s\n", name.c_str(), shape_str(shape).c_str());
  }
  std::printf("  %lld values, all readable\n", static_cast<long long>(total));
  return 0;
}

}  // namespace relay
