# Theory figures (issue 4): from the committed training-capture and checkpoint records.
THEORY_RESULTS := ../experiments/results/training_capture.jsonl ../experiments/results/training_capture_checkpoint.jsonl
FIGURES += out/exponent_hist.png out/coverage_sigma.png out/ratio_by_kind.png

out/exponent_hist.png: fig_exponent_hist.py $(THEORY_RESULTS)
	$(PYTHON) fig_exponent_hist.py $@ $(filter %.jsonl,$^)

out/coverage_sigma.png: fig_coverage_sigma.py $(THEORY_RESULTS)
	$(PYTHON) fig_coverage_sigma.py $@ $(filter %.jsonl,$^)

out/ratio_by_kind.png: fig_ratio_by_kind.py $(THEORY_RESULTS)
	$(PYTHON) fig_ratio_by_kind.py $@ $(filter %.jsonl,$^)
