"""The products the model and the runtime multiply with, below both: plain float32 layouts (``fast_linear``),
float64-accumulated (``invariant``), batch-invariant int8 (``int8``) and oneDNN-packed float32 (``onednn``).
Torch only; no model, no state."""
