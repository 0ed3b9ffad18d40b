"""Generation backends: a batch of prompts in, sampled token ids, text and log-probabilities out."""
