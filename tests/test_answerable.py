"""cosearch_cli/answerable.py: RL training questions whose gold answer the agent is shown, without a title
shortcut (`rl_questions = "answerable"`)."""

from cosearch_cli.answerable import answer_in_view, answerable_questions
from cosearch_cli.records import Question

QUERY = "Lyon Cohen Polish-born Canadian businessman philanthropist grandfather"


class WordTokenizer:
    """One token per space-separated word: budgets below count words."""

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [text.split() for text in texts]}

    def decode(self, ids):
        return " ".join(ids)


def test_answer_in_view_cuts_each_text_to_the_budget():
    texts = ["one two Montreal", "Montreal first", "none here"]
    assert answer_in_view(WordTokenizer(), ["Montreal"], texts, 2) == [False, True, False]
    assert answer_in_view(WordTokenizer(), ["Montreal"], texts, 3) == [True, True, False]
    assert answer_in_view(WordTokenizer(), ["Montreal"], texts, None) == [True, True, False]


def test_questions_kept_only_when_the_retrievers_passages_show_an_answer(fixture_bm25):
    questions = [Question("kept", QUERY, ["Leonard Cohen"]),  # the grandson, named in Lyon Cohen's passage
                 Question("title", QUERY + " who", ["Lyon Cohen"]),  # the passage's title: a copy would score
                 Question("absent", QUERY + " where", ["Zanzibar"]),
                 Question("yes-no", QUERY + " was he", ["yes"])]
    kept = answerable_questions(questions, index=fixture_bm25, retriever="bm25", tokenizer=WordTokenizer(), k=3,
                                top_n=5, passage_tokens=48)
    assert [q.id for q in kept] == ["kept"]
    # "Leonard Cohen" is two words: a one-word view can never show it
    assert answerable_questions(questions, index=fixture_bm25, retriever="bm25", tokenizer=WordTokenizer(), k=3,
                                top_n=5, passage_tokens=1) == []
    assert answerable_questions([], index=fixture_bm25, retriever="bm25", tokenizer=WordTokenizer(), k=3, top_n=5,
                                passage_tokens=48) == []
