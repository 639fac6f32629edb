"""ftrun-chaos: break a running ftrun cluster on purpose and prove nothing is lost.

plan.py (the plan file), nodes.py (network-namespace nodes), job.py (the job
and what it printed), faults.py (each fault, for real), schedule.py (when),
verdict.py (what must hold), report.py (JSON, Markdown, PNG), run.py (one
run), cli.py (the command line)."""
