"""The weight kinds of the native library (``qmatmul.h``'s ``AGL_*``)."""

KIND_Q4, KIND_Q8 = 4, 8
KIND_Q5 = 5                                       # Q5_0 / Q5_1 blocks (kquant.h)
KIND_Q4_K, KIND_Q5_K, KIND_Q6_K = 14, 15, 16      # K-quant super-blocks (kquant.h)
K_KINDS = (KIND_Q5, KIND_Q4_K, KIND_Q5_K, KIND_Q6_K)   # the kinds of kquant.h's builds
