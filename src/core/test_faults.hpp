// Test-only fault injection inside collectives: with RELAY_TEST_KILL_WHERE=<site>-stop (SIGSTOP) or <site>-kill
// (SIGKILL), the rank that arms it (train/restarts.hpp: RELAY_TEST_KILL_RANK at RELAY_TEST_KILL_STEP) raises the
// signal right after it next starts the collective of `site`: a rank stopped or lost while that collective is in
// flight, overlapped with the other ranks' compute. Sites: "bucket" (a gradient bucket's all-reduce), "tp" (a
// column-parallel input gradient's all-reduce, or reduce-scatter under sequence parallelism, during the weight
// gradients), "ep" (a MoE layer's dispatch all-to-all), "cp" (a key/value all-gather started ahead of the attention
// it feeds).
#pragma once

namespace relay {

// Arms the site RELAY_TEST_KILL_WHERE names, if it has the <site>-stop / <site>-kill form; returns whether it did.
bool arm_test_fault();
// Called right after `site`'s collective starts: raises the armed signal, once, if `site` is armed.
void test_fault_point(const char* site);

}  // namespace relay
