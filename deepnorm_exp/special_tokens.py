"""The ids of the special tokens a translation source writes and the encoder-decoder reads (padding masks,
teacher forcing, greedy decoding): one definition for both sides. Real tokens start at SPECIALS."""

PAD, BOS, EOS = 0, 1, 2
SPECIALS = 3  # how many ids the specials take
