"""A tiny LoCoMo-shaped data set for the benchmark tests: two sessions of twelve facts per conversation,
five questions that each name their fact's words (categories 1, 2 and 4), and one item without evidence."""

from __future__ import annotations

from typing import Any

FACTS = [
    "I adopted a grey kitten called Pepper from the shelter",
    "my sister is getting married in Lisbon next spring",
    "I finally fixed the leaking kitchen tap with a new washer",
    "the pottery class taught me how to centre clay on the wheel",
    "we drove to the coast and watched the surfers at dawn",
    "my manager approved the budget for the solar panels project",
    "I am reading a novel about a lighthouse keeper in Norway",
    "the marathon training plan says forty kilometres this week",
    "our band is rehearsing a cover of an old jazz standard",
    "I planted tomatoes, basil and chillies on the balcony",
    "the dentist said my wisdom tooth has to come out",
    "I switched my laptop to a keyboard with brown switches",
]
QUESTIONS = [  # (question, index of the fact that answers it, LoCoMo category)
    ("What is the name of the kitten that was adopted?", 0, 4),
    ("Where is the sister's wedding?", 1, 4),
    ("How was the kitchen tap repaired?", 2, 1),
    ("What vegetables and herbs are growing on the balcony?", 9, 4),
    ("Which tooth does the dentist want to remove?", 10, 2),
]


def conversation(n: int) -> dict[str, Any]:
    speakers = (f"Ana{n}", f"Ben{n}")
    turns = [{"speaker": speakers[i % 2], "dia_id": f"D{1 + i // 6}:{1 + i % 6}", "text": f"{fact} ({n})"}
             for i, fact in enumerate(FACTS)]
    qa = [{"question": q, "answer": FACTS[i], "evidence": [turns[i]["dia_id"]], "category": c}
          for q, i, c in QUESTIONS]
    qa.append({"question": "Is anything unanswerable?", "adversarial_answer": "no", "evidence": [],
               "category": 5})  # no usable evidence: excluded from recall
    return {
        "sample_id": f"conv-{n}",
        "conversation": {
            "speaker_a": speakers[0], "speaker_b": speakers[1],
            "session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": turns[:6],
            "session_2_date_time": "10:04 am on 12 June, 2023", "session_2": turns[6:],
        },
        "qa": qa,
    }
