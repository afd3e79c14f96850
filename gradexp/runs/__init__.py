"""The run directory's contract, shared by both sides: what a run writes and where (rundir),
one writer per run (runlock), the measures read from its files (measures), what it ran on
(provenance), write errors in one line (write_errors) and a search's history (search_record).
The standard library only: no gradexp folder below it, no TensorFlow."""
