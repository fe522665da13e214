#include "convert.hpp"

#include <atomic>

namespace attn_py {

namespace {
std::atomic<std::int64_t> g_input_copies{0};

std::string type_name(const py::handle& obj) { return py::str(py::type::of(obj).attr("__name__")); }

bool is_numpy(const py::handle& obj, const char* type) {
    return py::isinstance(obj, py::module_::import("numpy").attr(type));
}

}  // namespace

std::string given(const py::handle& obj) {
    std::string r = py::repr(obj);
    if (r.size() > 60) r = r.substr(0, 57) + "...";
    return type_name(obj) + " " + r;
}

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

namespace {
// torch refuses numpy() on a tensor that requires grad; asked first so that the message names the
// argument and the way out rather than torch's RuntimeError.
void refuse_requires_grad(const py::handle& obj, const std::string& name) {
    if (py::hasattr(obj, "requires_grad") && py::bool_(obj.attr("requires_grad"))) {
        type_error(name + ": a tensor with requires_grad=True cannot be read (attn's NumPy functions have no "
                   "autograd); pass " + name + ".detach(), or use attn.torch for gradients");
    }
}

bool is_torch_bfloat16(const py::handle& obj) {
    return py::hasattr(obj, "dtype") && std::string(py::str(obj.attr("dtype"))) == "torch.bfloat16";
}
}  // namespace

py::array as_array(const py::handle& obj, const std::string& name) {
    if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj);
    // numpy makes an object array of shape () from None; the message would speak of its shape.
    if (obj.is_none()) type_error(name + ": expected an array (numpy array, torch tensor, nested list) but got None");
    // Likewise a str or bytes (a 0-d string array), whose message would speak of its shape.
    if (PyUnicode_Check(obj.ptr()) || PyBytes_Check(obj.ptr()))
        type_error(name + ": expected an array (numpy array, torch tensor, nested list) but got " + given(obj));
    refuse_requires_grad(obj, name);
    // NumPy has no bfloat16, so torch cannot export such a tensor; say how to pass its bits.
    if (is_torch_bfloat16(obj)) {
        type_error(name + ": a torch.bfloat16 tensor has no NumPy form; pass " + name +
                   ".view(torch.int16).numpy().view(numpy.uint16) with dtype=\"bfloat16\", or use attn.torch");
    }
    py::array a = py::array::ensure(obj);
    if (a) return a;
    // array::ensure clears numpy's error (throwing error_already_set then would report
    // "error indicator not set"): ask numpy again for the reason, only on this failure path.
    std::string reason = "numpy cannot convert it";
    try {
        py::module_::import("numpy").attr("asarray")(obj);
    } catch (py::error_already_set& e) {
        if (e.matches(PyExc_MemoryError)) throw;  // out of memory converting it: not a wrong type
        reason = e.what();
        // pybind11 appends the Python traceback ("\n\nAt:\n  file(line): ..."): keep the message.
        reason = reason.substr(0, reason.find('\n'));
    }
    type_error(name + ": expected an array (numpy array, torch tensor, nested list) but got " + type_name(obj) + ": " +
               reason);
}

namespace {
// What numpy says about `a`, for layout_of.
RawArray raw_of(const py::array& a, bool uint16_is_bf16) {
    const py::dtype dt = a.dtype();
    RawArray r;
    r.uint16_is_bf16 = uint16_is_bf16;
    r.kind = dt.kind();
    r.itemsize = static_cast<std::int64_t>(dt.itemsize());
    r.dtype_name = dt.attr("name").cast<std::string>();
    for (py::ssize_t i = 0; i < a.ndim(); ++i) {
        r.shape.push_back(static_cast<std::int64_t>(a.shape(i)));
        r.byte_strides.push_back(static_cast<std::int64_t>(a.strides(i)));
    }
    r.native_order = py::bool_(dt.attr("isnative"));
    r.aligned = (a.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_) != 0;
    return r;
}
}  // namespace

attn::TensorView view_of(py::array& a, const std::string& name, int min_rank, int max_rank, const char* layout,
                         bool uint16_is_bf16) {
    ArrayLayout l = layout_of(raw_of(a, uint16_is_bf16), name, min_rank, max_rank, layout);
    if (l.refusal == ArrayLayout::Refusal::rank) value_error(l.message);
    if (l.refusal == ArrayLayout::Refusal::dtype) type_error(l.message);
    if (l.needs_copy) {
        // One native, aligned, C-contiguous copy (byte-swapped when the order is not native),
        // made by numpy so that an allocation failure is numpy's MemoryError with the size.
        a = a.attr("astype")(a.dtype().attr("newbyteorder")("="), "C");
        ++g_input_copies;
        l = layout_of(raw_of(a, uint16_is_bf16), name, min_rank, max_rank, layout);
        if (l.needs_copy) value_error(name + ": numpy's copy of the array is still not readable in place");
    }
    return attn::TensorView(const_cast<void*>(a.data()), l.dtype, l.shape, l.strides);
}

Input input(const py::handle& obj, const std::string& name, int min_rank, int max_rank, const char* layout,
            bool uint16_is_bf16) {
    Input in{as_array(obj, name), {}};
    in.view = view_of(in.array, name, min_rank, max_rank, layout, uint16_is_bf16);
    return in;
}

py::array new_array(attn::DType dt, const std::vector<py::ssize_t>& dims, const char* what) {
    try {
        if (dt == attn::DType::f64) return py::array_t<double>(dims);
        if (dt == attn::DType::f16) return py::array(py::dtype("float16"), dims);
        if (dt == attn::DType::bf16) return py::array_t<std::uint16_t>(dims);
        return py::array_t<float>(dims);
    } catch (py::error_already_set& e) {
        if (!e.matches(PyExc_MemoryError)) throw;
        // numpy's message says the bytes, the shape and the dtype; `what` says which output it was.
        throw attn::OutOfMemory(std::string("out of memory allocating ") + what + ": " + std::string(py::str(e.value())));
    }
}

attn::TensorView output_view(py::array& a, int rank) {
    return expand_rank(view_of(a, "output", 0, 4, "an array", true), rank);
}

std::vector<std::pair<std::string, attn::TensorView>> named_inputs(const py::dict& d, const std::string& what,
                                                                   std::vector<Input>& keep, bool uint16_is_bf16) {
    std::vector<std::pair<std::string, attn::TensorView>> out;
    for (const auto& item : d) {
        if (!py::isinstance<py::str>(item.first)) {
            type_error(what + ": keys must be str but got " + std::string(py::str(py::type::of(item.first))));
        }
        // str_arg, not pybind11's cast: a key with a lone surrogate is not UTF-8, and the cast said
        // only "Unable to cast Python instance to C++ type".
        const std::string name = str_arg(item.first, what + " key");
        py::object value = py::reinterpret_borrow<py::object>(item.second);
        bool bits = uint16_is_bf16;
        const std::string arg = what + "['" + name + "']";
        if (is_torch_bfloat16(value)) {
            // Its bits as a uint16 NumPy view of the same memory (any strides: no copy), after the
            // checks every tensor gets; torch's refusal (a meta or GPU tensor) names the entry.
            refuse_requires_grad(value, arg);
            try {
                const py::object int16 = py::module_::import("torch").attr("int16");
                value = value.attr("view")(int16).attr("numpy")().attr("view")(py::module_::import("numpy").attr("uint16"));
            } catch (py::error_already_set& e) {
                if (e.matches(PyExc_MemoryError)) throw;  // out of memory reading it: not a wrong type
                const std::string reason = e.what();
                type_error(arg + ": a torch.bfloat16 tensor whose bits NumPy cannot read: " + reason.substr(0, reason.find('\n')));
            }
            bits = true;
        }
        keep.push_back(input(value, arg, 0, 4, "an array of rank <= 4", bits));
        out.emplace_back(name, keep.back().view);
    }
    return out;
}

std::optional<attn::DType> storage_dtype_arg(const py::handle& dtype) {
    const std::string s = py::str(dtype);
    if (s == "float32" || s == "torch.float32") return attn::DType::f32;
    if (s == "float16" || s == "torch.float16") return attn::DType::f16;
    if (s == "bfloat16" || s == "torch.bfloat16") return attn::DType::bf16;
    try {
        const py::dtype dt = py::dtype::from_args(py::reinterpret_borrow<py::object>(dtype));
        if (dt.kind() == 'f' && dt.itemsize() == 4) return attn::DType::f32;
        if (dt.kind() == 'f' && dt.itemsize() == 2) return attn::DType::f16;
    } catch (py::error_already_set&) {
        // not a dtype at all: the caller's TypeError names the argument
    }
    return std::nullopt;
}

attn::DType cache_storage_arg(const py::handle& dtype) {
    if (const auto dt = storage_dtype_arg(dtype)) return *dt;
    type_error("dtype: the cache stores float32, float16 or bfloat16 (a str, NumPy or torch dtype) but got " +
               std::string(py::repr(dtype)));
}

std::string path_arg_of(const py::handle& obj, const std::string& name) {
    const bool path_like = !PyUnicode_Check(obj.ptr()) && py::hasattr(obj, "__fspath__");
    return str_arg(path_like ? obj.attr("__fspath__")() : py::reinterpret_borrow<py::object>(obj), name);
}

bool uint16_is_bf16_arg(const py::handle& obj) {
    if (obj.is_none()) return false;
    if (PyUnicode_Check(obj.ptr()) && str_arg(obj, "dtype") == "bfloat16") return true;
    type_error("dtype: says how to read uint16 inputs: expected \"bfloat16\" (their bits are bfloat16) or None but got " +
                given(obj));
}

attn::DType sixteen_bit_or_f32(attn::DType q) {
    return q == attn::DType::f16 || q == attn::DType::bf16 ? q : attn::DType::f32;
}

attn::DType out_dtype_arg(const py::handle& obj, attn::DType fallback, const char* name, bool with_float64) {
    return given_out_dtype_arg(obj, name, with_float64).value_or(fallback);
}

std::optional<attn::DType> given_out_dtype_arg(const py::handle& obj, const char* name, bool with_float64) {
    if (obj.is_none()) return std::nullopt;
    const std::string expected = std::string(name) + ": expected \"float32\", " + (with_float64 ? "\"float64\", " : "") +
                                 "\"float16\", \"bfloat16\" or None but got ";
    std::string dtype;
    if (PyUnicode_Check(obj.ptr())) {
        dtype = str_arg(obj, name);
    } else {
        try {  // np.float16, np.dtype("float32"), ...
            dtype = py::str(py::module_::import("numpy").attr("dtype")(obj).attr("name"));
        } catch (py::error_already_set&) {
            type_error(expected + given(obj));
        }
    }
    if (dtype == "float32") return attn::DType::f32;
    if (dtype == "float16") return attn::DType::f16;
    if (dtype == "bfloat16") return attn::DType::bf16;
    if (dtype == "float64" && with_float64) return attn::DType::f64;
    if (dtype == "float64") type_error(expected + given(obj) + ": this call computes in float32, not float64");
    type_error(expected + given(obj));
}

attn::DType stat_dtype(attn::DType q) { return q == attn::DType::f64 ? attn::DType::f64 : attn::DType::f32; }

std::vector<py::ssize_t> dims_of(const attn::TensorView& t, int first) {
    std::vector<py::ssize_t> d;
    for (int i = first; i < t.rank(); ++i) d.push_back(t.dim(i));
    return d;
}

std::optional<std::int64_t> int_of(const py::handle& obj, const std::string& name) {
    // Only ints and numpy integer scalars: arrays and tensors also have __index__ when they
    // hold one integer, but a (1,) array is a per-sequence value, not a scalar.
    if (PyBool_Check(obj.ptr())) return std::nullopt;
    if (!PyLong_Check(obj.ptr()) && !is_numpy(obj, "integer")) {
        return std::nullopt;
    }
    const py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(obj.ptr()));
    if (!i) throw py::error_already_set();
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    if (overflow != 0) value_error(name + ": expected an int64 but got " + std::string(py::repr(i)));
    return static_cast<std::int64_t>(v);
}

std::int64_t int_arg(const py::handle& obj, const std::string& name) {
    const std::optional<std::int64_t> v = int_of(obj, name);
    if (!v) type_error(name + ": expected an int but got " + given(obj));
    return *v;
}

std::optional<std::int64_t> optional_int_arg(const py::handle& obj, const std::string& name) {
    if (obj.is_none()) return std::nullopt;
    const std::optional<std::int64_t> v = int_of(obj, name);
    if (!v) type_error(name + ": expected an int or None but got " + given(obj));
    return v;
}

std::uint64_t uint_arg(const py::handle& obj, const std::string& name) {
    if (PyBool_Check(obj.ptr()) || (!PyLong_Check(obj.ptr()) && !is_numpy(obj, "integer"))) {
        type_error(name + ": expected an int but got " + given(obj));
    }
    const py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(obj.ptr()));
    if (!i) throw py::error_already_set();
    const unsigned long long v = PyLong_AsUnsignedLongLong(i.ptr());
    if (PyErr_Occurred()) {
        PyErr_Clear();
        value_error(name + ": expected " + std::string(kUint64Range) + " but got " + std::string(py::repr(i)));
    }
    return static_cast<std::uint64_t>(v);
}

double float_arg(const py::handle& obj, const std::string& name) {
    // Numbers only: a str, a bool or a sequence is a mistake, not a value.
    const bool zero_dim = py::isinstance<py::array>(obj) && py::reinterpret_borrow<py::array>(obj).ndim() == 0 &&
                          std::string("fiu").find(py::reinterpret_borrow<py::array>(obj).dtype().kind()) !=
                              std::string::npos;
    const bool number = !PyBool_Check(obj.ptr()) && !is_numpy(obj, "bool_") &&
                        (PyFloat_Check(obj.ptr()) || PyLong_Check(obj.ptr()) || is_numpy(obj, "number") || zero_dim);
    if (!number) type_error(name + ": expected a float but got " + given(obj));
    const double v = PyFloat_AsDouble(obj.ptr());
    if (PyErr_Occurred()) {
        PyErr_Clear();  // an int too large for a double
        value_error(name + ": expected a float but got " + given(obj) + " (out of range)");
    }
    return v;
}

std::optional<double> optional_float_arg(const py::handle& obj, const std::string& name) {
    if (obj.is_none()) return std::nullopt;
    return float_arg(obj, name);
}

bool bool_arg(const py::handle& obj, const std::string& name) {
    if (PyBool_Check(obj.ptr())) return obj.ptr() == Py_True;
    if (is_numpy(obj, "bool_")) return PyObject_IsTrue(obj.ptr()) == 1;
    type_error(name + ": expected True or False but got " + given(obj));
}

std::string str_arg(const py::handle& obj, const std::string& name) {
    if (!PyUnicode_Check(obj.ptr())) type_error(name + ": expected a str but got " + given(obj));
    Py_ssize_t size = 0;
    const char* utf8 = PyUnicode_AsUTF8AndSize(obj.ptr(), &size);
    if (utf8 == nullptr) {
        PyErr_Clear();  // lone surrogates
        value_error(name + ": expected a str encodable as UTF-8 but got " + given(obj));
    }
    return std::string(utf8, static_cast<std::size_t>(size));
}

int threads_arg(const py::handle& obj, const char* none_means) {
    const std::optional<std::int64_t> n = optional_int_arg(obj, "threads");
    if (!n) return 0;
    // 0 is None: no count of the call's own (docs/environment.md, "One thread setting").
    if (*n < 0 || *n > 4096) {
        throw attn::Error(std::string("threads: expected a thread count from 1 to 4096 (or 0 or None: ") + none_means +
                          ") but got " + std::to_string(*n));
    }
    return static_cast<int>(*n);
}

}  // namespace attn_py
