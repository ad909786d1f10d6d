"""Offline tools around the runtime: bench, info, calibrate, perplexity, profile (observe, plot), predictor
training (predictor_fit, predictor_train, predictor_out), the Hub (hub, catalog) and `place` (a placement plan
for a file). The CLI commands are thin shells over these; no runtime module imports them."""
