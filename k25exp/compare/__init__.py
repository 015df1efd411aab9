"""`k25exp compare A B`: two runs, sweeps or campaigns, figure by figure, with significance
from the raw samples the runs kept (resolve → table (samples, stats, directions) → render,
track; command.py is the CLI)."""
