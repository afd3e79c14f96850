"""`python -m gradexp.bench`: see gradexp.bench.run."""
from gradexp.bench.run import main

main()
