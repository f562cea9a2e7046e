// Dense row-major matrices: the shape every query batch and key block has in knnserve.
#ifndef KNNSERVE_COMMON_MATRIX_H_
#define KNNSERVE_COMMON_MATRIX_H_

#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/check.h"
#include "absl/types/span.h"

namespace knnserve {

// A borrowed rows x cols row-major view; the viewed memory must outlive it.
template <typename T>
struct MatrixView {
  T* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;

  T* row(int64_t r) const { return data + r * cols; }
  int64_t size() const { return rows * cols; }

  // A mutable view converts to a read-only one.
  template <typename U = T, typename = std::enable_if_t<!std::is_const_v<U>>>
  operator MatrixView<const U>() const {  // NOLINT(google-explicit-constructor)
    return {data, rows, cols};
  }
};

// An owning rows x cols row-major matrix. Thread-compatible.
template <typename T>
class Matrix {
 public:
  Matrix() = default;
  Matrix(int64_t rows, int64_t cols) : rows_(rows), cols_(cols), data_(rows * cols) {}
  // REQUIRES: data.size() == rows * cols.
  Matrix(int64_t rows, int64_t cols, std::vector<T> data)
      : rows_(rows), cols_(cols), data_(std::move(data)) {
    KNNSERVE_CHECK(static_cast<int64_t>(data_.size()) == rows_ * cols_, "data size != rows * cols");
  }

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t size() const { return rows_ * cols_; }
  bool empty() const { return data_.empty(); }

  T* data() { return data_.data(); }
  const T* data() const { return data_.data(); }
  T* row(int64_t r) { return data_.data() + r * cols_; }
  const T* row(int64_t r) const { return data_.data() + r * cols_; }
  T& at(int64_t r, int64_t c) { return data_[r * cols_ + c]; }
  const T& at(int64_t r, int64_t c) const { return data_[r * cols_ + c]; }

  MatrixView<T> view() { return {data_.data(), rows_, cols_}; }
  MatrixView<const T> view() const { return {data_.data(), rows_, cols_}; }
  absl::Span<const T> span() const { return data_; }

  friend bool operator==(const Matrix& a, const Matrix& b) {
    return a.rows_ == b.rows_ && a.cols_ == b.cols_ && a.data_ == b.data_;
  }

 private:
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  std::vector<T> data_;
};

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_MATRIX_H_
