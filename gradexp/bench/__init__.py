"""What gradexp costs over the model's own arithmetic: `python -m gradexp.bench [--quick]`
(run), its sweeps (sweeps), alternating rounds (rounds) and its Markdown page (report)."""
