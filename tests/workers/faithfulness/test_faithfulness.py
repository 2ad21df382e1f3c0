"""The faithfulness checks the worker's guards apply: support, vacuity, worked-example matches, Summary cleaning."""

from __future__ import annotations

from emelex_workers import faithfulness as fx

SOURCE = [
    "We're moving the orders service from MySQL to PostgreSQL 16.",
    "Agreed: request bodies are never logged, only their size in bytes.",
    "Gunicorn listens on port 8000 inside the container. Retries stop after 5 attempts.",
]
EXAMPLE = "The user asked which port the server uses. The server listens on port 8080."


def test_a_quote_or_all_content_words_in_one_sentence_is_supported() -> None:
    assert fx.supported("the orders service from MySQL to PostgreSQL 16", SOURCE)  # a quote, any case
    assert fx.supported("The orders service moves to PostgreSQL 16.", SOURCE)  # "moves" ~ "moving"
    assert fx.support("The orders service moves to PostgreSQL 16.", SOURCE) == 1.0


def test_words_from_different_sentences_other_numbers_or_another_polarity_are_not_supported() -> None:
    assert not fx.supported("Gunicorn retries 5 attempts.", SOURCE)  # words from two sentences
    assert not fx.supported("Gunicorn listens on port 8080.", SOURCE)  # a number the source does not say
    assert not fx.supported("Request bodies are logged.", SOURCE)  # the source says "never logged"
    assert fx.supported("Request bodies are never logged.", SOURCE)
    assert fx.support("Gunicorn listens on port 8080.", SOURCE) == 0.75


def test_vacuous_content_has_fewer_than_two_content_words() -> None:
    assert fx.vacuous("The feature is a feature.")
    assert fx.vacuous("linux")
    assert not fx.vacuous("Logs go to Loki.")


def test_a_worked_example_copy_matches_unless_the_source_quotes_it() -> None:
    assert fx.matches_example("The server listens on port 8080.", [EXAMPLE], SOURCE)
    assert fx.matches_example("The server listens on port 8000.", [EXAMPLE], SOURCE)  # near-copy: Jaccard 0.6
    assert not fx.matches_example("The server listens on port 8080.", [EXAMPLE], ["The server listens on port 8080."])
    assert not fx.matches_example("Gunicorn listens on port 8000 inside the container.", [EXAMPLE], SOURCE)


def test_corroboration_counts_words_restated_in_other_events() -> None:
    sources = ["Keep the status column until Q3.", "Understood: the status column stays until Q3.", "Thanks."]
    assert fx.corroboration("Keep the status column until Q3.", sources) == 0.8  # 4 of 5 words; "keep" is not
    assert fx.corroboration("Thanks.", sources) == 0.0
    assert fx.corroboration("", sources) == 0.0


def test_key_names_are_identifiers_file_names_and_numbers() -> None:
    text = "Use db/migrations/ with order_state, PostgreSQL 16 and port 8080, e.g. on GitHub."
    assert fx.key_names(text) == ["db/migrations/", "order_state", "PostgreSQL", "16", "8080", "GitHub"]


def test_repeated_and_looping_sentences_are_cut_and_a_cut_tail_is_trimmed() -> None:
    check = fx.check_summary(
        "The orders service moves to PostgreSQL 16. Request bodies are never logged. "
        "The orders service moves to PostgreSQL 16. Gunicorn listens on port 8000 and the",
        sources=SOURCE,
    )
    assert check.text == "The orders service moves to PostgreSQL 16. Request bodies are never logged."
    assert (check.sentences, check.repeated, check.trimmed, check.problem) == (4, 1, True, None)
    assert fx.looping("the user asked about it and the user asked about it and the user asked about it")
    assert not fx.looping("The orders service moves to PostgreSQL 16 before the end of Q3.")


def test_a_lone_fragment_is_kept_as_it_is() -> None:
    check = fx.check_summary("The orders service moves to PostgreSQL 16", sources=SOURCE)
    assert (check.text, check.trimmed, check.problem) == ("The orders service moves to PostgreSQL 16", False, None)


def test_echoes_of_the_worked_example_and_invented_names_are_cut() -> None:
    check = fx.check_summary(
        "The server listens on port 8080. The orders service moves to PostgreSQL 16. It uses the m0 module. "
        "Gunicorn listens on port 8000. Retries stop after 5 attempts.", sources=SOURCE, examples=[EXAMPLE])
    assert check.text == ("The orders service moves to PostgreSQL 16. Gunicorn listens on port 8000. "
                          "Retries stop after 5 attempts.")
    assert (check.echoed, check.invented, check.problem) == (1, 1, None)
    counted = fx.check_summary("It took 3 turns to agree on PostgreSQL 16.", sources=SOURCE)
    assert (counted.invented, counted.unsupported) == (0, 1)  # a count is no invented name, but no source says it


def test_mostly_repetition_or_nothing_left_is_degenerate() -> None:
    looped = fx.check_summary("Logs go to Loki. Logs go to Loki. Logs go to Loki.", sources=["Logs go to Loki."])
    assert looped.text == "Logs go to Loki." and looped.repeated == 2 and "2 of its 3 sentences" in looped.problem
    echoed = fx.check_summary(EXAMPLE, sources=SOURCE, examples=[EXAMPLE])
    assert echoed.text == "" and echoed.echoed == 2 and echoed.problem.startswith("nothing is left")
    assert fx.check_summary("   ", sources=SOURCE).problem is not None


def test_a_summary_keeps_its_lines_and_speaker_labels() -> None:
    check = fx.check_summary(
        "user: We're moving the orders service from MySQL to PostgreSQL 16. We're moving the orders service from "
        "MySQL to PostgreSQL 16.\nassistant: Gunicorn listens on port 8000 inside the container. Retries stop after "
        "5 attempts.\nsummary: Request bodies are never logged.", sources=SOURCE)
    assert check.text == ("user: We're moving the orders service from MySQL to PostgreSQL 16.\n"
                          "assistant: Gunicorn listens on port 8000 inside the container. Retries stop after 5 "
                          "attempts.\nsummary: Request bodies are never logged.")
    assert (check.sentences, check.repeated, check.problem) == (5, 1, None)


def test_a_sentence_quoted_from_the_source_is_not_cut_as_looping() -> None:
    chant = "Check the lock, check the lock, check the lock before you deploy."
    assert fx.looping(chant)
    check = fx.check_summary(f"user: {chant}", sources=[chant, *SOURCE])
    assert (check.text, check.repeated, check.problem) == (f"user: {chant}", 0, None)
    assert fx.check_summary(chant, sources=SOURCE).problem is not None  # not quoted: still cut


def test_sentence_splitting_respects_code_spans_paths_ellipses_and_version_numbers() -> None:
    text = ("A plain `pip install -e .` will not compile the extension. Use `make test. now` instead.\n"
            "Someone proposed 1% sampling in production... and nobody liked it. Run it from ./build. Then pin "
            "version 3.12.1 of numpy. Abbreviations, e.g. Redis, stay whole. Run `cd .. && make` twice.")
    assert fx.sentences(text) == [
        "A plain `pip install -e .` will not compile the extension.",
        "Use `make test. now` instead.",
        "Someone proposed 1% sampling in production... and nobody liked it.",
        "Run it from ./build.",
        "Then pin version 3.12.1 of numpy.",
        "Abbreviations, e.g. Redis, stay whole.",
        "Run `cd .. && make` twice.",
    ]
    assert fx.sentences("Install it with pip install -e . and restart. Done.") == [
        "Install it with pip install -e . and restart.", "Done."]
    fenced = "Build it with:\n```\nmake build\nmake test\n```\nThat is all."
    assert fx.sentences(fenced) == ["Build it with:", "```\nmake build\nmake test\n```", "That is all."]


def test_summary_lines_keep_a_closed_code_block_whole_and_an_unclosed_one_is_plain_lines() -> None:
    from emelex_workers.faithfulness import summary_lines, terminated

    assert summary_lines("assistant: ```sh\nls -l\n```\nuser: ok") == ["assistant: ```sh\nls -l\n```", "user: ok"]
    assert summary_lines("assistant: ```\nx\nuser: y") == ["assistant: ```", "x", "user: y"]
    assert summary_lines("a ``` b\n```") == ["a ``` b", "```"]  # only a line that opens with a fence opens one
    assert terminated("```sh\nls -l\n```") and not terminated("```sh\nls -l")


def test_a_title_or_initial_before_a_name_does_not_end_a_sentence() -> None:
    # A capitalised token without a vowel ("Mr", "Dr", "Mrs", "St") or a single capital letter is an abbreviation
    # or an initial, whatever it abbreviates: a shape, not a list.
    text = "We met Dr. Varga at the clinic. Mrs. Lindqvist runs the shop on Elm St. now. J. Osei signed it."
    assert fx.sentences(text) == ["We met Dr. Varga at the clinic.",
                                  "Mrs. Lindqvist runs the shop on Elm St. now.",
                                  "J. Osei signed it."]
    # A word ending a sentence still ends it, and a vowel-less word in capitals is no title.
    assert fx.sentences("We bought a new TV. It is big. Ask Bo. He knows.") == [
        "We bought a new TV.", "It is big.", "Ask Bo.", "He knows."]
