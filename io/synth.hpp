// A learnable synthetic classification set (`relay data synth`): Gaussian inputs labelled by a fixed
// random "teacher" MLP (D -> 64 tanh -> C, argmax), the teacher-student setup of learning theory.
//
// Two seeds: `teacher_seed` draws the teacher (the labelling function), `seed` draws the inputs.
// Train and eval files made with different --seed but the same teacher_seed share one teacher, so a
// model trained on one generalises to the other; the default teacher_seed is the same for every file.
// The teacher is calibrated on a reference sample drawn from teacher_seed: its output biases are set
// so that every class gets about 1/C of the samples, and inputs closer to a class boundary than the
// reference sample's 40% quantile of (best - second-best logit) are redrawn, so the inputs are
// N(0, 1) conditioned on a margin. The margin is what makes a few thousand samples enough: a
// 64 -> 256 GELU -> 10 MLP trained on 4096 samples reaches ~96% eval accuracy (~85% without it).
//
// File: /inputs float32 [N, D], /targets int64 [N]; root attributes generator = "relay data synth",
// seed, teacher_seed, classes, teacher_hidden. The bytes depend only on the arguments (no timestamps).
#pragma once
#include <cstdint>
#include <string>

namespace relay {

inline constexpr uint64_t kDefaultTeacherSeed = 1234;
inline constexpr int64_t kTeacherHidden = 64;
inline constexpr int64_t kMaxClasses = 10000;  // the class balancing costs O(C^2)

// Throws relay::Error naming --samples (N >= 1), --features (D >= 1) or --classes (2 <= C <= 10000),
// or the file when it cannot be written. Overwrites an existing file.
void write_synthetic_classification(const std::string& path, int64_t samples, int64_t features, int64_t classes,
                                    uint64_t seed, uint64_t teacher_seed = kDefaultTeacherSeed);

}  // namespace relay
