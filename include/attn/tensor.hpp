// Tensors: an owning, 64-byte-aligned Tensor and a non-owning TensorView.
//
// A view is (pointer, dtype, shape, strides); strides are counted in elements, may be
// zero (broadcast) and need not be increasing. attn's logical layout is (B, H, L, D):
// a (B, L, H, D) buffer — what a projection GEMM produces — is the same data seen
// through view.transpose(1, 2), never a copy.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "attn/dtype.hpp"
#include "attn/error.hpp"

namespace attn {

inline constexpr int kMaxRank = 4;

struct Shape {
    int rank = 0;
    std::array<std::int64_t, kMaxRank> dims{};

    Shape() = default;
    Shape(std::initializer_list<std::int64_t> d);  // throws attn::Error when rank > 4 or a dim < 0

    std::int64_t operator[](int i) const { return dims[static_cast<std::size_t>(i)]; }
    // Throws attn::Error when the product of the non-zero dims exceeds INT64_MAX: such a
    // shape has no addressable layout even when a zero dim makes it empty.
    std::int64_t numel() const;
    std::string str() const;  // "(2, 8, 512, 64)"
    bool operator==(const Shape& o) const;
};

using Strides = std::array<std::int64_t, kMaxRank>;

// Row-major (C order) strides of a shape, in elements.
Strides contiguous_strides(const Shape& shape);

class TensorView {
public:
    TensorView() = default;
    TensorView(void* data, DType dtype, Shape shape, Strides strides);
    TensorView(void* data, DType dtype, Shape shape);  // C-contiguous

    void* data() const { return data_; }
    template <class T>
    T* data_as() const { return static_cast<T*>(data_); }
    DType dtype() const { return dtype_; }
    const Shape& shape() const { return shape_; }
    int rank() const { return shape_.rank; }
    std::int64_t dim(int i) const { return shape_[i]; }
    std::int64_t stride(int i) const { return strides_[static_cast<std::size_t>(i)]; }
    const Strides& strides() const { return strides_; }
    std::int64_t numel() const { return shape_.numel(); }
    bool empty() const { return data_ == nullptr; }
    bool is_contiguous() const;

    // Element offset (in elements) of a multi-index; unused trailing indices are 0.
    std::int64_t offset(std::int64_t i0, std::int64_t i1 = 0, std::int64_t i2 = 0,
                        std::int64_t i3 = 0) const {
        return i0 * strides_[0] + i1 * strides_[1] + i2 * strides_[2] + i3 * strides_[3];
    }

    // Views of the same data. All check their arguments and throw attn::Error.
    TensorView transpose(int a, int b) const;
    TensorView slice(int dim, std::int64_t start, std::int64_t length) const;
    // Right-aligned numpy broadcasting to `target`; size-1 (or missing) dims get stride 0.
    // `what` names the tensor in the error message.
    TensorView broadcast_to(const Shape& target, std::string_view what) const;

    // Any element (float, bool or int dtype) read as double; i is an element offset.
    double load_as_double(std::int64_t i) const;

private:
    void* data_ = nullptr;
    DType dtype_ = DType::f32;
    Shape shape_{};
    Strides strides_{};
};

// Owning, C-contiguous, 64-byte aligned (from 2 MiB on: 2 MiB aligned, huge pages advised —
// core/allocate.hpp, allocate_streamed). Move-only. Contents are uninitialised unless
// `fill_zero` is set (kernels write every element; tests poison before they run).
// A shape whose byte count exceeds INT64_MAX throws attn::Error; an allocation the system
// refuses throws attn::OutOfMemory naming `name`, the shape and the bytes.
class Tensor {
public:
    Tensor() = default;
    Tensor(DType dtype, Shape shape, bool fill_zero = false, std::string_view name = "a tensor");
    // Tensor(dt, shape, "name"): without this, a string literal would convert to bool fill_zero.
    // (A template on the array, so that Tensor(dt, shape, 0) still means fill_zero = false.)
    template <std::size_t N>
    Tensor(DType dtype, Shape shape, const char (&name)[N]) : Tensor(dtype, shape, false, std::string_view(name)) {}
    // A moved-from Tensor is an empty one (no data, as Tensor()): the implicit move copied the
    // view, whose pointer then named memory the other Tensor owns — and freed, once it died
    // (a moved-from training state passed its "empty" check and read freed memory).
    Tensor(Tensor&& other) noexcept : storage_(std::move(other.storage_)), view_(std::exchange(other.view_, TensorView{})) {}
    Tensor& operator=(Tensor&& other) noexcept {
        storage_ = std::move(other.storage_);
        view_ = std::exchange(other.view_, TensorView{});
        return *this;
    }

    TensorView view() const { return view_; }
    operator TensorView() const { return view_; }  // NOLINT(google-explicit-constructor)
    void* data() const { return view_.data(); }
    template <class T>
    T* data_as() const { return view_.data_as<T>(); }
    DType dtype() const { return view_.dtype(); }
    const Shape& shape() const { return view_.shape(); }
    std::int64_t numel() const { return view_.numel(); }
    std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype()); }

private:
    struct Free {
        void operator()(void* p) const;
    };
    std::unique_ptr<void, Free> storage_;
    TensorView view_;
};

// Copy any floating view into a new contiguous tensor of a floating dtype, each value rounded
// once to nearest even (float64 to float16/bfloat16 too: double_to_f16/bf16, attn/half.hpp).
// Used at boundaries (the CLI, tests), never in a kernel. `name` names the new tensor when its
// allocation is refused (attn::OutOfMemory, as Tensor's constructor says).
Tensor to_dtype(const TensorView& src, DType dst, std::string_view name = "a tensor");

}  // namespace attn
