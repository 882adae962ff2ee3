// SPDX-License-Identifier: Apache-2.0
#pragma once
/// ScratchDir: a directory of a test's own, made fresh under the temporary directory and removed with
/// everything in it when the object goes. Needs nothing from the runtime, so the app tests use it too.

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace spindle::testing_support {

/// A fresh directory under the temporary directory, removed with everything in it on destruction.
class ScratchDir {
public:
    ScratchDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "spindle-test-XXXXXX").string();
        if (::mkdtemp(tmpl.data()) != nullptr) { dir_ = tmpl; }
    }
    ~ScratchDir() {
        if (!dir_.empty()) {
            std::error_code ec;
            std::filesystem::remove_all(dir_, ec);
        }
    }
    ScratchDir(const ScratchDir&) = delete;
    ScratchDir& operator=(const ScratchDir&) = delete;

    /// Whether the directory was made (mkdtemp's errno is lost by then; it is rare enough).
    [[nodiscard]] bool ok() const { return !dir_.empty(); }
    [[nodiscard]] const std::string& dir() const { return dir_; }
    [[nodiscard]] std::string path(const char* name) const { return dir_ + "/" + name; }

private:
    std::string dir_;  // empty when mkdtemp failed
};

}  // namespace spindle::testing_support
