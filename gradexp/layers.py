"""The custom-gradient layer, under its public name: `from gradexp.parts.layers import ClipGradient`
(defined in gradexp.parts.layers)."""
from gradexp.parts.layers import ClipGradient, clip_gradient

__all__ = ["ClipGradient", "clip_gradient"]
