"""What a model config derives, with no framework: one TP rank of it as a model (tp_rank), its
checkpoint's quantization_config (quant_config), the bytes of weights vLLM holds for it
(weight_bytes). Below every other package: the GEMM shapes, the config checks and the server's
generated folder all use them."""
