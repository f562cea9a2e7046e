// A fresh temporary directory per test, removed afterwards.
#ifndef KNNSERVE_TESTS_DATASTORE_TEMP_DIR_H_
#define KNNSERVE_TESTS_DATASTORE_TEMP_DIR_H_

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace knnserve::testing {

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) /
           (std::string("datastore_") + info->test_suite_name() + "_" + info->name() + "_" +
            std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
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

#endif  // KNNSERVE_TESTS_DATASTORE_TEMP_DIR_H_
