// Scratch directories for tests. ctest runs every test case as its own process, several
// at once, so a directory is private to the process: its name carries the pid.
#ifndef KNNSERVE_TESTS_TESTING_TEMP_DIR_H_
#define KNNSERVE_TESTS_TESTING_TEMP_DIR_H_

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace knnserve::testing {

// Returns <gtest temp dir>/knnserve_<name>_<pid>, emptied and created.
inline std::filesystem::path FreshTempDir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                    ("knnserve_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A fresh temporary directory per test, removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = FreshTempDir(std::string(info->test_suite_name()) + "_" + info->name());
    devnull_ = std::fopen("/dev/null", "w");
  }
  void TearDown() override {
    std::fclose(devnull_);
    std::filesystem::remove_all(dir_);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::string Write(const std::string& name, const std::string& content) const {
    std::ofstream(Path(name), std::ios::binary) << content;
    return Path(name);
  }

  std::filesystem::path dir_;
  std::FILE* devnull_ = nullptr;  // progress output of the code under test
};

}  // namespace knnserve::testing

#endif  // KNNSERVE_TESTS_TESTING_TEMP_DIR_H_
