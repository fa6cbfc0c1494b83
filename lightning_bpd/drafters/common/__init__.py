"""What every drafter kind shares: norms, RoPE and the SwiGLU MLP (``layers``), the drafter cache (``cache``), the
feature-reading trainer (``trainer``), the feature path of a proposer (``proposing``) and the GGUF drafter keys
(``gguf``)."""
