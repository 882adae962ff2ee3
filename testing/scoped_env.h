// SPDX-License-Identifier: Apache-2.0
#pragma once
/// An environment variable set for one scope (a test), put back as it was, set or not, at its end.
/// Thread-safety: none; setenv is not safe against a concurrent getenv, so set it before threads start.

#include <cstdlib>
#include <optional>
#include <string>

namespace spindle::testing_support {

class ScopedEnv {
public:
    ScopedEnv(const char* name, const char* value) : name_(name) {
        if (const char* old = std::getenv(name)) { saved_ = old; }
        ::setenv(name, value, 1);
    }
    ~ScopedEnv() {
        if (saved_) {
            ::setenv(name_, saved_->c_str(), 1);
        } else {
            ::unsetenv(name_);
        }
    }
    ScopedEnv(const ScopedEnv&) = delete;
    ScopedEnv& operator=(const ScopedEnv&) = delete;

private:
    const char* name_;
    std::optional<std::string> saved_;
};

}  // namespace spindle::testing_support
