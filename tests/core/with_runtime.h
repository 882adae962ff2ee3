#pragma once
/// The fixture the core tests share (STYLE snippet 5): a runtime of two carriers
/// (two even on a one-core machine, so that the cross-carrier paths always run),
/// and a TearDown that fails the test if a fiber outlived it.

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <thread>
#include <utility>

#include "core/runtime.h"

namespace spindle::testing_support {

inline RuntimeOptions withCarriers(unsigned n) {
    RuntimeOptions o;
    o.carriers = n;
    return o;
}

/// liveFibers() once it stops changing, waiting at most 10 s: detached fibers that
/// are finishing get a moment; a leaked fiber stays counted and fails the test.
inline uint64_t settledLiveFibers(const Runtime& rt) {
    using namespace std::chrono_literals;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (rt.liveFibers() != 0 && std::chrono::steady_clock::now() < deadline) { std::this_thread::sleep_for(1ms); }
    return rt.liveFibers();
}

class WithRuntime : public testing::Test {
protected:
    void SetUp() override {
        auto rt = Runtime::start(withCarriers(2));
        ASSERT_TRUE(rt) << "Runtime::start: " << rt.error().message();
        runtime_.emplace(std::move(*rt));
    }
    void TearDown() override {
        if (runtime_) { EXPECT_EQ(settledLiveFibers(*runtime_), 0u); }
    }

    Runtime& rt() { return *runtime_; }

    /// Starts fn pinned to `carrier` (aborts the test binary if it cannot).
    template <class F>
    auto on(int carrier, F&& fn, const char* name = nullptr) {
        return runtime_->spawn(std::forward<F>(fn), SpawnOptions{.name = name, .carrier = carrier, .pinned = true})
            .value();
    }

    /// Runs fn on a fiber and returns its value (rethrows its exception).
    template <class F>
    auto onFiber(F&& fn, int carrier = SpawnOptions::kAnyCarrier) {
        return runtime_->spawn(std::forward<F>(fn), SpawnOptions{.carrier = carrier}).value().join();
    }

    std::optional<Runtime> runtime_;
};

}  // namespace spindle::testing_support
