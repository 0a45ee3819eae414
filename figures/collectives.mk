# Collectives vs NCCL (issues 5-6): from experiments/bench_collectives.py's records.
FIGURES += out/collectives.png

out/collectives.png: fig_collectives.py ../experiments/records.py ../experiments/results/collectives.jsonl
	$(PYTHON) fig_collectives.py $@ $(filter %.jsonl,$^)
