#include "convert.hpp"

#include <atomic>
#include <new>

namespace attn_py {

namespace {
std::atomic<std::int64_t> g_input_copies{0};

std::string type_name(const py::handle& obj) { return py::str(py::type::of(obj).attr("__name__")); }

// numpy dtype → attn dtype; unsupported dtypes are a TypeError naming the argument.
attn::DType dtype_of(const py::array& a, const std::string& name) {
    const py::dtype dt = a.dtype();
    const char kind = dt.kind();
    const auto size = dt.itemsize();
    if (kind == 'f' && size == 4) return attn::DType::f32;
    if (kind == 'f' && size == 8) return attn::DType::f64;
    if (kind == 'f' && size == 2) return attn::DType::f16;
    if (kind == 'b' && size == 1) return attn::DType::boolean;
    if (kind == 'i' && size == 4) return attn::DType::i32;
    if (kind == 'i' && size == 8) return attn::DType::i64;
    type_error(name + ": unsupported dtype " + dt.attr("name").cast<std::string>() +
               " (expected float32, float64, float16, bool, int32 or int64)");
}
}  // namespace

void type_error(const std::string& msg) { throw PyTypeError(msg); }
void value_error(const std::string& msg) { throw attn::Error(msg); }

std::int64_t input_copies() { return g_input_copies.load(); }

std::string shape_str(const py::array& a) {
    std::string s = "(";
    for (py::ssize_t i = 0; i < a.ndim(); ++i) {
        if (i) s += ", ";
        s += std::to_string(a.shape(i));
    }
    return s + (a.ndim() == 1 ? ",)" : ")");
}

py::array as_array(const py::handle& obj, const std::string& name) {
    if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj);
    // torch refuses numpy() on a tensor that requires grad; asked first so that the message
    // names the argument and the way out rather than torch's RuntimeError.
    if (py::hasattr(obj, "requires_grad") && py::bool_(obj.attr("requires_grad"))) {
        type_error(name + ": a tensor with requires_grad=True cannot be read (attn has no autograd); pass " + name +
                   ".detach()");
    }
    py::array a = py::array::ensure(obj);
    if (a) return a;
    // array::ensure clears numpy's error (throwing error_already_set then would report
    // "error indicator not set"): ask numpy again for the reason, only on this failure path.
    std::string reason = "numpy cannot convert it";
    try {
        py::module_::import("numpy").attr("asarray")(obj);
    } catch (py::error_already_set& e) {
        reason = e.what();
    }
    type_error(name + ": expected an array (numpy array, torch tensor, nested list) but got " + type_name(obj) + ": " +
               reason);
}

attn::TensorView view_of(py::array& a, const std::string& name, int min_rank, int max_rank, const char* layout) {
    if (a.ndim() < min_rank || a.ndim() > max_rank) {
        value_error(name + ": expected " + layout + " (rank " + std::to_string(min_rank) +
                    (min_rank == max_rank ? "" : " to " + std::to_string(max_rank)) + ") but got shape " +
                    shape_str(a));
    }
    const attn::DType dt = dtype_of(a, name);
    const auto item = static_cast<py::ssize_t>(a.itemsize());
    for (py::ssize_t i = 0; i < a.ndim(); ++i) {
        if (a.strides(i) % item != 0) {
            // Byte strides that no element stride can express: copy (counted, documented).
            a = py::array::ensure(a, py::array::c_style | py::array::forcecast);
            if (!a) throw std::bad_alloc();
            ++g_input_copies;
            break;
        }
    }
    attn::Shape shape;
    attn::Strides strides{};
    shape.rank = static_cast<int>(a.ndim());
    for (int i = 0; i < shape.rank; ++i) {
        shape.dims[static_cast<std::size_t>(i)] = a.shape(i);
        strides[static_cast<std::size_t>(i)] = a.strides(i) / item;
    }
    return attn::TensorView(const_cast<void*>(a.data()), dt, shape, strides);
}

Input input(const py::handle& obj, const std::string& name, int min_rank, int max_rank, const char* layout) {
    Input in{as_array(obj, name), {}};
    in.view = view_of(in.array, name, min_rank, max_rank, layout);
    return in;
}

attn::TensorView expand_rank(const attn::TensorView& t, int rank) {
    if (t.rank() >= rank) return t;
    attn::Shape s;
    attn::Strides st{};
    s.rank = rank;
    const int pad = rank - t.rank();
    for (int i = 0; i < rank; ++i) {
        const auto u = static_cast<std::size_t>(i);
        s.dims[u] = i < pad ? 1 : t.dim(i - pad);
        st[u] = i < pad ? 0 : t.stride(i - pad);
    }
    return attn::TensorView(t.data(), t.dtype(), s, st);
}

py::array new_array(attn::DType dt, const std::vector<py::ssize_t>& dims) {
    if (dt == attn::DType::f64) return py::array_t<double>(dims);
    return py::array_t<float>(dims);
}

attn::TensorView output_view(py::array& a, int rank) { return expand_rank(view_of(a, "output", 0, 4, "an array"), rank); }

std::vector<py::ssize_t> dims_of(const attn::TensorView& t, int first) {
    std::vector<py::ssize_t> d;
    for (int i = first; i < t.rank(); ++i) d.push_back(t.dim(i));
    return d;
}

std::optional<std::int64_t> int_of(const py::handle& obj, const std::string& name) {
    // Only ints and numpy integer scalars: arrays and tensors also have __index__ when they
    // hold one integer, but a (1,) array is a per-sequence value, not a scalar.
    if (PyBool_Check(obj.ptr())) return std::nullopt;
    if (!PyLong_Check(obj.ptr()) && !py::isinstance(obj, py::module_::import("numpy").attr("integer"))) {
        return std::nullopt;
    }
    const py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(obj.ptr()));
    if (!i) throw py::error_already_set();
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    if (overflow != 0) value_error(name + ": expected an int64 but got " + std::string(py::repr(i)));
    return static_cast<std::int64_t>(v);
}

}  // namespace attn_py
