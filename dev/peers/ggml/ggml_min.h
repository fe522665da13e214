// Minimal hand-written declarations for the prebuilt ggml in @node-llama-cpp/linux-x64 3.22.1
// (ggml_version() reports 0.25.1 / commit 0ad4a86). Each declaration below was checked against
// `nm -D` of libggml-base.so / libggml-cpu-zen4.so and against ggml.h / ggml-cpu.h /
// ggml-backend.h text from ggml-org/llama.cpp. Only opaque pointers + the stable
// ggml_init_params struct are used; struct ggml_tensor is never dereferenced.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#ifdef __cplusplus
extern "C" {
#endif
struct ggml_context; struct ggml_tensor; struct ggml_cgraph; struct ggml_backend_reg;
typedef struct ggml_backend_reg * ggml_backend_reg_t;
typedef uint16_t ggml_fp16_t;

struct ggml_init_params { size_t mem_size; void * mem_buffer; bool no_alloc; };
enum ggml_type { GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1 };          // values fixed in ggml.h ("always add at end")
enum ggml_prec { GGML_PREC_DEFAULT = 0, GGML_PREC_F32 = 10 };
enum ggml_status { GGML_STATUS_ALLOC_FAILED = -2, GGML_STATUS_FAILED = -1, GGML_STATUS_SUCCESS = 0, GGML_STATUS_ABORTED = 1 };

// libggml-base.so
const char *          ggml_version(void);
const char *          ggml_commit(void);
struct ggml_context * ggml_init(struct ggml_init_params params);
void                  ggml_free(struct ggml_context * ctx);
size_t                ggml_tensor_overhead(void);
size_t                ggml_graph_overhead(void);
struct ggml_tensor *  ggml_new_tensor_4d(struct ggml_context * ctx, enum ggml_type type, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3);
struct ggml_tensor *  ggml_flash_attn_ext(struct ggml_context * ctx, struct ggml_tensor * q, struct ggml_tensor * k,
                                          struct ggml_tensor * v, struct ggml_tensor * mask,
                                          float scale, float max_bias, float logit_softcap);
void                  ggml_flash_attn_ext_set_prec(struct ggml_tensor * a, enum ggml_prec prec);
struct ggml_cgraph *  ggml_new_graph(struct ggml_context * ctx);
void                  ggml_build_forward_expand(struct ggml_cgraph * cgraph, struct ggml_tensor * tensor);
void *                ggml_get_data(const struct ggml_tensor * tensor);
size_t                ggml_nbytes(const struct ggml_tensor * tensor);
float                 ggml_fp16_to_fp32(ggml_fp16_t);
void                  ggml_fp32_to_fp16_row(const float *, ggml_fp16_t *, int64_t);
const char *          ggml_backend_reg_name(ggml_backend_reg_t reg);
void *                ggml_backend_reg_get_proc_address(ggml_backend_reg_t reg, const char * name);

struct ggml_backend_feature { const char * name; const char * value; };
typedef struct ggml_backend_feature * (*ggml_backend_get_features_t)(ggml_backend_reg_t reg);

// libggml-cpu-zen4.so
void             ggml_cpu_init(void);
enum ggml_status ggml_graph_compute_with_ctx(struct ggml_context * ctx, struct ggml_cgraph * cgraph, int n_threads);
ggml_backend_reg_t ggml_backend_cpu_reg(void);
int ggml_cpu_has_avx2(void);
int ggml_cpu_has_avx512(void);
int ggml_cpu_has_avx512_vnni(void);
int ggml_cpu_has_avx512_bf16(void);
int ggml_cpu_has_f16c(void);
int ggml_cpu_has_fma(void);
#ifdef __cplusplus
}
#endif
