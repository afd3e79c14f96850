"""Data of one's own: a function (**kwargs) -> ((x_train, y_train), (x_val, y_val))."""

import numpy as np


def rings(n=2000, noise=0.3, seed=0):
    """Points on three noisy concentric rings in the plane; the label is the ring."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 3, n)
    angle = rng.uniform(0, 2 * np.pi, n)
    radius = 1.0 + label + noise * rng.standard_normal(n)
    x = np.stack([radius * np.cos(angle), radius * np.sin(angle)], 1).astype(np.float32)
    split = int(0.8 * n)
    return (x[:split], label[:split]), (x[split:], label[split:])
