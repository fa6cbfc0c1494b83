"""The DSpark drafter kind (DeepSeek, arXiv 2607.05147): a DFlash backbone run anchor-first, with a low-rank Markov
head that biases each slot's logits by the token before it and a confidence head that may end a block early."""
