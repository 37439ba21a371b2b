"""The quantized CPU kernels and the conversions that put them into a decoder.

Modules, bottom up (each imports only those above it):

* ``build``  — the C++ extension ``specdec_cpu_kernels`` (``linear_kernels*.cpp``, ``layer_ops.cpp`` with
  ``attention_avx512.cpp``, ``int8_gemm*.cpp``, ``simd.h``): built once per machine under ``specdec_home()/ext``, then imported;
  availability.
* ``linear`` — the one shape of a C++ kernel layer (``KernelLinear``: ``on_matrix``, ``first_rows``,
  ``concat``) and ``on_rows``.
* ``int8``   — ``Int8Linear``: int8 weights × per-token int8 activations (mode ``int8``): our AVX-512
  VNNI GEMM (``int8_gemm*.cpp``; on AMX tiles from 2 rows where the CPU has AMX-INT8, same bits)
  where the CPU has it, fbgemm elsewhere.
* ``q4``     — ``Q4Linear`` (llama.cpp's Q4_K values) and ``Q8Linear``: the int4 mode's layers.
* ``q6``     — ``Q6Linear`` (Q6_K values): the int4 mode's precise layers.
* ``embedding`` — ``BlockEmbedding``: a GGUF token table kept in its own blocks (rows dequantized on
  lookup, bit-identical to the float table it replaces).
* ``layers`` — ``CppLayers``: a decoder's layers with their glue in C++ (a decoder's layer runner).
* ``convert``— whole-decoder conversions (``quantize_decoder``: int8, ``quantize_decoder_q4``: int4),
  projection fusing, and the serialized form (``quantized_state`` / ``load_quantized_state``).

Dependency direction: ``specdec.models.weights`` (the loader) → ``specdec.kernels`` → ``torch``,
``specdec.errors``, ``specdec.paths`` only. Nothing here imports ``specdec.models``: kernels work on
tensors and ``nn.Module``s, and reach a decoder only through its declared interface
(``set_fused_projections``, ``set_layer_runner``, ``row_wise_attention``, ``quantization``; see
``convert``), used by duck typing. The decoder (``specdec.models.transformer``) imports nothing from
here either: a quantized head cuts itself through its own ``first_rows``.

This package's ``__init__`` imports none of its modules: import the one you use.
"""
