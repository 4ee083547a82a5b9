"""The replies' length and repetition summary recorded in the continuation artifact."""

from peftbd.data.reply_stats import distinct_ngram_share, reply_stats


def test_distinct_share_is_one_for_fresh_text_and_low_for_a_loop():
    assert distinct_ngram_share(list(range(20))) == 1.0
    loop = [1, 2, 3] * 20  # 57 4-grams, 3 distinct
    assert distinct_ngram_share(loop) == 3 / 57
    assert distinct_ngram_share([1, 2, 3]) is None


def test_stats_count_lengths_percentiles_and_loops():
    replies = [list(range(n)) for n in range(1, 11)] + [[7, 8] * 30]
    s = reply_stats(replies)
    assert s["replies"] == 11 and s["max_tokens"] == 60
    assert s["mean_tokens"] == round((55 + 60) / 11, 2)
    assert (s["p10_tokens"], s["p50_tokens"], s["p90_tokens"]) == (2, 6, 10)
    assert s["loop_share"] == round(1 / 8, 4)  # 7 fresh replies of >= 4 tokens, one loop


def test_no_replies_gives_nones():
    assert set(reply_stats([]).values()) == {None}
