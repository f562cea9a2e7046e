// The main of every test binary: the process settings of knnserve's executables first
// (common/process_init.h), so that a test and the binaries it starts run the same OpenBLAS
// kernels (and so compute the same floats), then the tests.
#include "common/process_init.h"
#include "gmock/gmock.h"

int main(int argc, char** argv) {
  knnserve::InitProcess(argv);
  testing::InitGoogleMock(&argc, argv);
  return RUN_ALL_TESTS();
}
