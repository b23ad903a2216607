"""Keyword-spotting corpora: synthesised from Debian's speech synthesizers, or a user's folder.

    >>> from host.data.corpus import build_corpus, load_corpus
    >>> corpus = build_corpus(seed=0)           # cached under .cache/edgelearn/
    >>> x, y = corpus.split_clips("test")       # (N, 16000) int16, label ids
"""
