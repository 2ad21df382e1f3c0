"""Writes `benchmarks/search/conversations.json`: the multi-session conversation set of `bench_search.py`.

Run `python benchmarks/search/generate.py` to regenerate it (seeded: the same file every time) and
`python benchmarks/search/generate.py --check` to check the committed file's evidence labels mechanically.

Each conversation is between two people, dated, in 16 or more Sessions. Facts are planted as turns whose wording
varies (several phrasings per fact), questions are worded apart from their evidence where the fact allows it
(paraphrase: "novel" for "book", "pet" for "puppy"), the other person says the same kind of thing about themselves
(a distractor sharing the question's words), some facts change in a later Session (the question asks for the
current value: the later turn is the evidence; another asks for the earlier one), temporal questions ask when
something happened (the answer is the date of the Session it was said in, said there as "today" or "this
morning"), and multi-hop questions need two turns of different Sessions. The rest is small talk, with the other
person's name as a vocative.

The split is decided here, before any tuning: conversations with an odd number (c01, c03, ...) are the tuned half,
the even ones the untuned half (`"half"` of each conversation). The tuned half is the only one looked at while
ranking rules are changed; both are reported.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import re
import sys
from pathlib import Path

OUT = Path(__file__).with_name("conversations.json")
SEED = 37
CONVERSATIONS = 12
SESSIONS = (16, 19)  # Sessions per conversation, inclusive range
FILLER = (7, 12)  # small-talk turns per Session, inclusive range

PEOPLE = ["Maya", "Jon", "Priya", "Tomas", "Lena", "Omar", "Grace", "Kenji", "Sofia", "Daniel", "Aisha", "Felix",
          "Nora", "Ravi", "Clara", "Mateo", "Hana", "Lukas", "Zoe", "Ibrahim"]

# --- values the facts draw from -------------------------------------------------------------------------------
BOOKS = ["The Lean Startup", "Project Hail Mary", "Sapiens", "The Overstory", "Educated", "Circe", "Dune",
         "Klara and the Sun", "Atomic Habits", "The Name of the Wind", "Piranesi", "Station Eleven", "Middlemarch",
         "The Remains of the Day", "Thinking, Fast and Slow", "A Gentleman in Moscow"]
BREEDS = ["beagle", "border collie", "corgi", "labrador", "greyhound", "dachshund", "shiba inu", "poodle"]
PET_NAMES = ["Biscuit", "Pepper", "Maple", "Olive", "Juniper", "Mochi", "Rusty", "Clover", "Waffles", "Luna"]
JOBS = [("nurse", "St. Anne's hospital"), ("data analyst", "Brightline Insurance"), ("teacher", "Oakridge Primary"),
        ("barista", "Copper Kettle"), ("architect", "Halden & Roe"), ("sales manager", "Vireo Foods"),
        ("paramedic", "the county ambulance service"), ("graphic designer", "Lumen Studio"),
        ("accountant", "Pike Ledger"), ("physiotherapist", "Northside Clinic")]
HOBBIES = [("pottery", "wheel-throwing"), ("salsa", "dancing"), ("rock climbing", "bouldering"),
           ("watercolour", "painting"), ("Italian", "language"), ("improv", "comedy"), ("woodworking", "carpentry"),
           ("yoga", "stretching"), ("photography", "camera"), ("chess", "board game")]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
CITIES = ["Lisbon", "Kyoto", "Montreal", "Edinburgh", "Oaxaca", "Vienna", "Cape Town", "Hanoi", "Reykjavik",
          "Buenos Aires", "Tallinn", "Marrakesh", "Seville", "Melbourne"]
REASONS = ["a friend's wedding", "a work conference", "my grandmother's birthday", "a food festival",
           "a hiking week", "a concert"]
FOODS = ["ramen", "mac and cheese", "lentil soup", "dumplings", "shakshuka", "grilled cheese", "pho", "biryani"]
INSTRUMENTS = ["cello", "ukulele", "piano", "drums", "violin", "saxophone", "banjo"]
CARS = ["Honda Civic", "Toyota Prius", "Subaru Outback", "Volkswagen Golf", "Kia Niro", "Mazda 3", "Ford Focus"]
PLANTS = ["peonies", "sunflowers", "tomatoes", "lavender", "hydrangeas", "roses", "dahlias"]
MOVIES = ["Arrival", "Paddington 2", "Spirited Away", "Whiplash", "Moonlight", "Inception", "Amelie", "Coco"]
ALLERGENS = [("peanuts", "satay"), ("shellfish", "shrimp"), ("cats", "cat cafes"), ("pollen", "spring hikes"),
             ("dairy", "ice cream")]
PLACES = ["animal shelter", "food bank", "community garden", "library", "soup kitchen", "youth center"]
RACES = ["Riverside", "Harbor", "Lakeshore", "Hillcrest", "Old Town"]
NEIGHBOURHOODS = ["Greenwood", "Eastbank", "Millbrook", "Ashford", "Westgate", "Brookside", "Fairview"]
KIDS = ["Ella", "Leo", "Mila", "Noah", "Ava", "Finn", "Isla"]

DBS = ["Postgres", "MySQL", "Redis", "Elasticsearch", "Kafka", "MongoDB"]
SERVICES = ["billing", "checkout", "search", "notifications", "auth", "inventory", "reporting", "gateway", "ingest"]
DEPLOY_TOOLS = ["Helm", "Terraform", "Ansible", "ArgoCD", "Nomad", "Pulumi"]
SYMPTOMS = [("memory leak", "an unbounded cache of session objects"),
            ("slow login", "a missing index on the users email column"),
            ("flaky test", "a race between two fixtures sharing a temp dir"),
            ("nightly job timeout", "a retry loop with no backoff"),
            ("disk filling up", "debug logging left on in production"),
            ("duplicate emails", "the queue redelivering unacked messages"),
            ("CPU spike", "a regex with catastrophic backtracking")]
LIBS = [("PDF rendering", "WeasyPrint"), ("date parsing", "dateutil"), ("HTTP retries", "tenacity"),
        ("schema validation", "pydantic"), ("task scheduling", "APScheduler"), ("image resizing", "Pillow"),
        ("CSV export", "polars"), ("feature flags", "Unleash")]
PRODUCTS = ["the mobile app", "the partner API", "the admin console", "the desktop client", "the analytics SDK"]
SETTINGS = ["request timeout", "connection pool size", "cache TTL", "retry limit", "batch size"]
LANGS = ["Rust", "Go", "Kotlin", "TypeScript", "Elixir", "Python", "Scala"]
COMPONENTS = ["rate limiter", "tokenizer", "job scheduler", "image pipeline", "sync daemon", "query planner"]
REGIONS = ["eu-west-1", "us-east-2", "ap-southeast-1", "eu-central-1", "us-west-2"]
ENVS = ["staging", "production", "load-test", "sandbox"]
COLLEAGUES = ["Ingrid", "Marcus", "Yusuf", "Beatriz", "Declan", "Mei", "Anton", "Farah"]
FUNCTIONS = ["refunds", "password resets", "invoice PDFs", "push alerts", "stock counts", "webhook retries"]

# --- small talk -----------------------------------------------------------------------------------------------
OPENERS = ["Hey {o}! How's your week going?", "Hi {o}, long time no talk!", "Morning {o}! Got a minute?",
           "Hey {o}, are you around?", "Evening {o}! Quick catch-up?", "{o}! Hope the weekend was good.",
           "Hello {o}, how have you been?", "Hey hey {o}, what's new?"]
REPLIES = ["Pretty good, thanks for asking!", "Busy but fine. You?", "All good here, a bit tired though.",
           "Great to hear from you!", "Not bad at all, just the usual.", "Hectic, honestly, but I'm okay.",
           "Doing well, {o}. What about you?", "Can't complain! The weather helps."]
SMALL_TALK = ["Wow {o}, same here!", "What a day.", "Haha, that's amazing {o}.", "Oh no, that sounds stressful.",
              "I totally get that.", "That's so good to hear, {o}!", "Ugh, Mondays.", "Right? It's been a week.",
              "Honestly I needed that laugh.", "That makes sense to me.", "Sounds like a plan!",
              "You always find the best stuff, {o}.", "No way! Tell me more.", "I'm so happy for you.",
              "Fair enough, one step at a time.", "Same, I could use a holiday.", "Love that for you, {o}.",
              "Oh nice, good call.", "Hmm, I hadn't thought of it that way.", "That's wild.",
              "I know the feeling, {o}.", "Let's catch up properly soon.", "Keep me posted!", "Totally agree.",
              "Yeah, the weather has been strange lately.", "Coffee helps, as always.",
              "I slept terribly last night, so bear with me.", "Traffic was a nightmare again this morning.",
              "Did you see that storm on the news?", "My phone died twice today, what a mess.",
              "Good luck with everything, {o}!", "Thanks, {o}, that means a lot."]
CLOSERS = ["Gotta run, talk soon {o}!", "Okay, I'll let you go. Bye!", "Talk later, {o}!", "Catch you next week!",
           "Night {o}, take care.", "Speak soon!"]


def _pick(rng: random.Random, values: list, used: set) -> object:
    """A value of `values` not yet in `used` (then added), or any one when all are used."""
    free = [v for v in values if v not in used]
    value = rng.choice(free or values)
    used.add(value)
    return value


class Conversation:
    """One conversation's Sessions, turns and questions, built fact by fact."""

    def __init__(self, index: int, rng: random.Random) -> None:
        self.rng = rng
        self.id = f"c{index + 1:02d}"
        self.a, self.b = rng.sample(PEOPLE, 2)
        self.technical = index % 2 == 1  # every other conversation is between colleagues (technical and casual)
        n = rng.randint(*SESSIONS)
        day = dt.date(2023, 1, 1) + dt.timedelta(days=rng.randrange(0, 300))
        self.sessions: list[dict] = []
        for s in range(n):
            day += dt.timedelta(days=rng.randint(3, 21))
            self.sessions.append({"session": s + 1, "date": day.isoformat(), "plants": []})
        self.questions: list[dict] = []
        self.used: set = set()

    # Planting: a planted turn is (speaker, text) at a Session; its id is given when the Sessions are laid out.
    def plant(self, session: int, speaker: str, text: str) -> dict:
        turn = {"speaker": speaker, "text": text}
        self.sessions[session]["plants"].append(turn)
        return turn

    def ask(self, question: str, answer: str, evidence: list[dict], category: str) -> None:
        self.questions.append({"question": question, "answer": answer, "evidence": evidence, "category": category})

    def other(self, s: str) -> str:
        return self.b if s == self.a else self.a

    def when(self, session: int) -> str:
        return self.sessions[session]["date"]

    def two_sessions(self) -> tuple[int, int]:
        first = self.rng.randrange(0, len(self.sessions) - 4)
        return first, self.rng.randrange(first + 2, len(self.sessions))

    def layout(self) -> dict:
        """The Sessions' turns (small talk around the planted ones), each with an id, and the questions citing
        them."""
        turns_out = []
        for s in self.sessions:
            rng, first = self.rng, self.rng.choice([self.a, self.b])
            second = self.other(first)
            lines = [(first, rng.choice(OPENERS)), (second, rng.choice(REPLIES))]
            body = [(p["speaker"], p) for p in s["plants"]]
            for _ in range(rng.randint(*FILLER)):
                body.insert(rng.randrange(0, len(body) + 1), (rng.choice([self.a, self.b]), rng.choice(SMALL_TALK)))
            lines += body
            lines.append((rng.choice([self.a, self.b]), rng.choice(CLOSERS)))
            turns = []
            for k, (speaker, item) in enumerate(lines):
                text = item["text"] if isinstance(item, dict) else item.format(o=self.other(speaker))
                turn_id = f"{self.id}:s{s['session']}:t{k + 1}"
                if isinstance(item, dict):
                    item["id"] = turn_id
                turns.append({"id": turn_id, "speaker": speaker, "text": text})
            turns_out.append({"session": s["session"], "date": s["date"],
                              "title": f"{self.a} and {self.b}, session {s['session']}", "turns": turns})
        questions = []
        for n, q in enumerate(self.questions):
            questions.append({"id": f"{self.id}:q{n + 1}", "question": q["question"], "answer": q["answer"],
                              "category": q["category"], "evidence": [e["id"] for e in q["evidence"]]})
        return {"id": self.id, "half": "tuned" if int(self.id[1:]) % 2 else "untuned",
                "kind": "technical" if self.technical else "casual", "speakers": [self.a, self.b],
                "sessions": turns_out, "questions": questions}


# --- facts: each plants turns and asks questions ----------------------------------------------------------------
def book(c: Conversation, s: str) -> None:
    first, later = c.two_sessions()
    b1, b2 = _pick(c.rng, BOOKS, c.used), _pick(c.rng, BOOKS, c.used)
    t1 = c.plant(first, s, c.rng.choice([f"I'm currently reading {b1}, it's hard to put down.",
                                         f"My bedtime book these days is {b1}.",
                                         f"Just started {b1} last night and I'm hooked."]))
    c.plant(first, c.other(s), f"Nice! I keep meaning to read {_pick(c.rng, BOOKS, c.used)} myself.")
    t2 = c.plant(later, s, c.rng.choice([f"Finished {b1} at last. Now I've moved on to {b2}.",
                                         f"Done with {b1}! Started {b2} over the weekend.",
                                         f"{b1} is finished, so {b2} is next on my nightstand."]))
    c.ask(c.rng.choice([f"What book is {s} reading now?", f"Which novel has {s} been into most recently?"]),
          b2, [t2], "update")
    c.ask(f"Which book did {s} finish?", b1, [t2], "single")
    c.ask(c.rng.choice([f"What was {s} reading before {b2}?", f"Which title kept {s} up at night early on?"]),
          b1, [t1], "single")


def pet(c: Conversation, s: str) -> None:
    at = c.rng.randrange(len(c.sessions))
    breed, name = _pick(c.rng, BREEDS, c.used), _pick(c.rng, PET_NAMES, c.used)
    t = c.plant(at, s, c.rng.choice([f"Big news: we adopted a {breed} puppy today! We're calling her {name}.",
                                     f"We brought home a little {breed} this morning. Her name is {name}.",
                                     f"Meet {name}, our new {breed}! We picked her up from the breeder today."]))
    c.plant(at, c.other(s), c.rng.choice(["Aww, send pictures!", "Oh my gosh, congratulations!"]))
    later = c.rng.randrange(at, len(c.sessions))
    c.plant(later, c.other(s), f"My neighbour's {_pick(c.rng, BREEDS, c.used)} keeps barking at night.")
    c.ask(c.rng.choice([f"When did {s} get a dog?", f"When did {s} adopt the new pet?"]), c.when(at), [t], "temporal")
    c.ask(c.rng.choice([f"What is the name of {s}'s dog?", f"What did {s} call the new puppy?"]), name, [t], "single")
    c.ask(f"What breed is {s}'s pet?", breed, [t], "single")


def job(c: Conversation, s: str) -> None:
    first, later = c.two_sessions()
    (j1, co1), (j2, co2) = _pick(c.rng, JOBS, c.used), _pick(c.rng, JOBS, c.used)
    t1 = c.plant(first, s, c.rng.choice([f"Work at {co1} is draining, being a {j1} there is a lot right now.",
                                         f"I've been a {j1} at {co1} for three years now."]))
    t2 = c.plant(later, s, c.rng.choice([f"I accepted an offer! I'll be a {j2} at {co2} from next month.",
                                         f"Handed in my notice at {co1}. Starting at {co2} as a {j2} soon."]))
    c.ask(c.rng.choice([f"Where is {s} working after the switch?", f"Which employer did {s} move to?"]), co2, [t2],
          "update")
    c.ask(f"What was {s}'s job before changing employers?", j1, [t1], "single")


def hobby(c: Conversation, s: str) -> None:
    at = c.rng.randrange(len(c.sessions))
    (h, kind), day = _pick(c.rng, HOBBIES, c.used), c.rng.choice(WEEKDAYS)
    t = c.plant(at, s, c.rng.choice([f"I signed up for {h} classes, every {day} evening.",
                                     f"Started {h} lessons on {day}s, I'm terrible but it's fun."]))
    c.plant(at, c.other(s), f"I tried {_pick(c.rng, HOBBIES, c.used)[0]} once and gave up after a week.")
    c.ask(c.rng.choice([f"What class does {s} take on {day}s?", f"Which new pastime did {s} pick up?"]), h, [t],
          "single")
    c.ask(f"On which day of the week are {s}'s {h} classes?", day, [t], "single")


def trip(c: Conversation, s: str) -> None:
    at = c.rng.randrange(len(c.sessions))
    city, reason = _pick(c.rng, CITIES, c.used), c.rng.choice(REASONS)
    t = c.plant(at, s, c.rng.choice([f"Just booked flights to {city} today, for {reason}.",
                                     f"We're off to {city} next month for {reason}, booked it this morning."]))
    c.plant(at, c.other(s), f"I loved {_pick(c.rng, CITIES, c.used)} when I went, the food was incredible.")
    c.ask(c.rng.choice([f"Which city is {s} travelling to for {reason.replace('my ', 'their ')}?",
                        f"Where is {s} flying to?"]), city, [t], "single")
    c.ask(f"When did {s} book the trip to {city}?", c.when(at), [t], "temporal")


def sibling(c: Conversation, s: str) -> None:
    first, later = c.two_sessions()
    city, sib = _pick(c.rng, CITIES, c.used), c.rng.choice(["brother", "sister", "cousin"])
    name = c.rng.choice(["Sam", "Alex", "Robin", "Jamie", "Kai", "Noor"])
    t1 = c.plant(first, s, f"My {sib} {name} moved to {city} last year for work.")
    t2 = c.plant(later, s, c.rng.choice([f"This weekend I'm going to visit {name}, can't wait.",
                                         f"I'm finally seeing {name} next weekend, first visit since the move."]))
    c.ask(f"Which city is {s} visiting to see family?", city, [t1, t2], "multi-hop")
    c.ask(f"Who is {name} to {s}?", sib, [t1], "single")


def food(c: Conversation, s: str) -> None:
    at = c.rng.randrange(len(c.sessions))
    f = _pick(c.rng, FOODS, c.used)
    t = c.plant(at, s, c.rng.choice([f"When I'm down, {f} fixes everything. My go-to comfort food.",
                                     f"Rough day, so I made a huge pot of {f}. Always cheers me up."]))
    c.plant(at, c.other(s), f"I'm more of a {_pick(c.rng, FOODS, c.used)} person myself.")
    c.ask(c.rng.choice([f"What does {s} eat when feeling low?", f"What is {s}'s comfort meal?"]), f, [t], "single")


def race(c: Conversation, s: str) -> None:
    at = c.rng.randrange(len(c.sessions))
    r, mins = c.rng.choice(RACES), c.rng.randint(95, 140)
    time = f"{mins // 60}:{mins % 60:02d}"
    t = c.plant(at, s, f"Ran the {r} half marathon this morning, finished in {time}!")
    c.ask(f"When did {s} run the {r} half marathon?", c.when(at), [t], "temporal")
    c.ask(f"What was {s}'s finishing time in the {r} race?", time, [t], "single")


def instrument(c: Conversation, s: str) -> None:
    first, later = c.two_sessions()
    i = _pick(c.rng, INSTRUMENTS, c.used)
    t1 = c.plant(first, s, f"I bought a second-hand {i} and I'm teaching myself from videos.")
    c.plant(later, s, "Practice is going slowly, my fingers hurt every evening.")
    c.ask(c.rng.choice([f"Which instrument is {s} learning?", f"What does {s} play?"]), i, [t1], "single")


def family(c: Conversation, s: str) -> None:
    at = c.rng.randrange(len(c.sessions))
    kid, age = _pick(c.rng, KIDS, c.used), c.rng.randint(4, 12)
    t = c.plant(at, s, f"{kid} turns {age} next week, we're planning a small party at the park.")
    c.ask(c.rng.choice([f"How old is {s}'s child turning?", f"What age is {kid} about to be?"]), str(age), [t],
          "single")
    c.ask(f"Where is the birthday party for {s}'s kid?", "the park", [t], "single")


def car(c: Conversation, s: str) -> None:
    first, later = c.two_sessions()
    c1, c2 = _pick(c.rng, CARS, c.used), _pick(c.rng, CARS, c.used)
    t1 = c.plant(first, s, f"The {c1} broke down again, third time this year.")
    t2 = c.plant(later, s, f"We sold the old {c1} and bought a {c2}. So much quieter.")
    c.ask(c.rng.choice([f"What car does {s} drive now?", f"Which vehicle did {s} buy?"]), c2, [t2], "update")
    c.ask(f"Which car kept breaking down for {s}?", c1, [t1], "single")


def garden(c: Conversation, s: str) -> None:
    at = c.rng.randrange(len(c.sessions))
    p = _pick(c.rng, PLANTS, c.used)
    t = c.plant(at, s, f"The {p} in the backyard finally bloomed this week.")
    c.ask(f"What flowered in {s}'s garden?", p, [t], "single")


def movie(c: Conversation, s: str) -> None:
    at = c.rng.randrange(len(c.sessions))
    m = _pick(c.rng, MOVIES, c.used)
    t = c.plant(at, s, c.rng.choice([f"Watched {m} on Saturday, the soundtrack was stunning.",
                                     f"Movie night: we finally saw {m}. I cried, no shame."]))
    c.plant(at, c.other(s), f"Have you seen {_pick(c.rng, MOVIES, c.used)}? Everyone keeps recommending it.")
    c.ask(c.rng.choice([f"What film did {s} watch?", f"Which movie moved {s} to tears or stunned them?"]), m, [t],
          "single")


def moving(c: Conversation, s: str) -> None:
    first, later = c.two_sessions()
    n1, n2 = _pick(c.rng, NEIGHBOURHOODS, c.used), _pick(c.rng, NEIGHBOURHOODS, c.used)
    t1 = c.plant(first, s, f"We signed the lease on a flat in {n1}. Moving in on the first.")
    t2 = c.plant(later, s, f"Landlord is selling, so we're relocating again, this time to {n2}.")
    c.ask(c.rng.choice([f"Which neighbourhood is {s} living in now?", f"Where did {s} relocate to most recently?"]),
          n2, [t2], "update")
    c.ask(f"Where was {s}'s first flat?", n1, [t1], "single")


def allergy(c: Conversation, s: str) -> None:
    at = c.rng.randrange(len(c.sessions))
    a, avoid = _pick(c.rng, ALLERGENS, c.used)
    t = c.plant(at, s, f"I'm allergic to {a}, so {avoid} are off the table for me.")
    c.ask(c.rng.choice([f"What is {s} allergic to?", f"What can't {s} be around without a reaction?"]), a, [t],
          "single")


def volunteer(c: Conversation, s: str) -> None:
    at = c.rng.randrange(len(c.sessions))
    place = _pick(c.rng, PLACES, c.used)
    t = c.plant(at, s, f"Spent the whole morning volunteering at the {place}. Exhausting but worth it.")
    c.ask(f"When did {s} volunteer at the {place}?", c.when(at), [t], "temporal")
    c.ask(f"Where did {s} help out as a volunteer?", place, [t], "single")


def db_version(c: Conversation, s: str) -> None:
    first, later = c.two_sessions()
    db, env = c.rng.choice(DBS), c.rng.choice(ENVS)
    v1 = f"{c.rng.randint(5, 14)}.{c.rng.randint(0, 9)}"
    v2 = f"{int(v1.split('.')[0]) + 1}.{c.rng.randint(0, 4)}"
    t1 = c.plant(first, s, f"Upgraded {env} to {db} {v1} today, no downtime.")
    t2 = c.plant(later, s, c.rng.choice([f"{env} is on {db} {v2} now, we rolled forward after the replication bug.",
                                         f"We bumped {env} again, {db} {v2} since this morning."]))
    c.ask(f"Which {db} version does {env} run now?", v2, [t2], "update")
    c.ask(f"When was {env} first upgraded to {db} {v1}?", c.when(first), [t1], "temporal")


def port(c: Conversation, s: str) -> None:
    at = c.rng.randrange(len(c.sessions))
    svc, p = _pick(c.rng, SERVICES, c.used), str(c.rng.randint(3000, 9999))
    t = c.plant(at, s, f"Heads up: the {svc} service listens on {p} now, I changed the config.")
    c.plant(at, c.other(s), f"Is that the same port as before? The old {svc} docs said {c.rng.randint(3000, 9999)}.")
    c.ask(c.rng.choice([f"What port does the {svc} service use?", f"Which port should I hit for {svc}?"]), p, [t],
          "single")


def deploy(c: Conversation, s: str) -> None:
    at = c.rng.randrange(len(c.sessions))
    svc = _pick(c.rng, SERVICES, c.used)
    tool, alt = c.rng.sample(DEPLOY_TOOLS, 2)
    t = c.plant(at, s, f"Decision made: {svc} goes out with {tool}, not {alt}. Fewer moving parts.")
    c.ask(c.rng.choice([f"Which tool did they choose to ship {svc}?", f"How is {svc} deployed?"]), tool, [t],
          "single")


def root_cause(c: Conversation, s: str) -> None:
    at = c.rng.randrange(len(c.sessions))
    symptom, cause = _pick(c.rng, SYMPTOMS, c.used)
    c.plant(at, c.other(s), f"Any luck with the {symptom}?")
    t = c.plant(at, s, c.rng.choice([f"Found it! {cause[0].upper()}{cause[1:]} was the culprit.",
                                     f"Yes, it was {cause} all along."]))
    c.ask(c.rng.choice([f"What was behind the {symptom}?", f"What caused the {symptom}?"]), cause, [t], "single")


def library(c: Conversation, s: str) -> None:
    at = c.rng.randrange(len(c.sessions))
    task, lib = _pick(c.rng, LIBS, c.used)
    t = c.plant(at, s, f"For {task} we settled on {lib}, the other options were too heavy.")
    c.ask(c.rng.choice([f"Which library do they use for {task}?", f"What did the team pick for {task}?"]), lib, [t],
          "single")


def release(c: Conversation, s: str) -> None:
    at = c.rng.randrange(len(c.sessions))
    product, ver = _pick(c.rng, PRODUCTS, c.used), f"{c.rng.randint(1, 5)}.{c.rng.randint(0, 20)}"
    t = c.plant(at, s, f"We shipped {product} {ver} this morning, fingers crossed.")
    c.ask(f"When was {product} {ver} released?", c.when(at), [t], "temporal")
    c.ask(f"Which version of {product} went out?", ver, [t], "single")


def setting(c: Conversation, s: str) -> None:
    first, later = c.two_sessions()
    name, svc = _pick(c.rng, SETTINGS, c.used), c.rng.choice(SERVICES)
    v1 = c.rng.choice([5, 10, 15, 20, 30])
    v2 = v1 * c.rng.choice([2, 3, 4])
    t1 = c.plant(first, s, f"The {name} for {svc} is {v1} right now.")
    t2 = c.plant(later, s, f"Raised the {svc} {name} to {v2}, the old value was too tight.")
    c.ask(f"What is the {name} for {svc} currently?", str(v2), [t2], "update")
    c.ask(f"What was the original {name} of {svc}?", str(v1), [t1], "single")


def language(c: Conversation, s: str) -> None:
    at = c.rng.randrange(len(c.sessions))
    comp, lang = _pick(c.rng, COMPONENTS, c.used), c.rng.choice(LANGS)
    t = c.plant(at, s, f"The {comp} got rewritten in {lang} over the holidays.")
    c.ask(c.rng.choice([f"What language is the {comp} written in?", f"What was the {comp} ported to?"]), lang, [t],
          "single")


def region(c: Conversation, s: str) -> None:
    at = c.rng.randrange(len(c.sessions))
    env, reg = _pick(c.rng, ENVS, c.used), c.rng.choice(REGIONS)
    t = c.plant(at, s, f"FYI the {env} cluster lives in {reg} since the migration.")
    c.ask(c.rng.choice([f"Where is the {env} cluster hosted?", f"Which cloud region runs {env}?"]), reg, [t],
          "single")


def owner(c: Conversation, s: str) -> None:
    first, later = c.two_sessions()
    svc, person, fn = _pick(c.rng, SERVICES, c.used), _pick(c.rng, COLLEAGUES, c.used), c.rng.choice(FUNCTIONS)
    t1 = c.plant(first, s, f"{person} owns the {svc} service, she wrote most of it.")
    t2 = c.plant(later, s, f"All the {fn} logic lives in {svc}, nowhere else.")
    c.ask(f"Who should I ask about {fn}?", person, [t1, t2], "multi-hop")
    c.ask(f"Which service handles {fn}?", svc, [t2], "single")


def oncall(c: Conversation, s: str) -> None:
    at = c.rng.randrange(len(c.sessions))
    t = c.plant(at, s, "Got paged three times overnight, on-call this week is brutal.")
    c.ask(f"When was {s}'s rough on-call night?", c.when(at), [t], "temporal")


CASUAL = [book, pet, job, hobby, trip, sibling, food, race, instrument, family, car, garden, movie, moving, allergy,
          volunteer]
TECHNICAL = [db_version, port, deploy, root_cause, library, release, setting, language, region, owner, oncall]


def build() -> dict:
    """The whole set, from `SEED`."""
    rng = random.Random(SEED)
    conversations = []
    for index in range(CONVERSATIONS):
        c = Conversation(index, rng)
        facts = rng.sample(CASUAL, 16) if not c.technical else rng.sample(CASUAL, 8) + rng.sample(TECHNICAL, 11)
        for n, fact in enumerate(facts):
            fact(c, c.a if n % 2 == 0 else c.b)
        conversations.append(c.layout())
    return {"about": __doc__.split("\n\n", 1)[0], "seed": SEED, "conversations": conversations}


def check(data: dict) -> list[str]:
    """The evidence-label faults of `data`: an evidence id that is no turn, an answer (other than a date) that no
    evidence turn holds, a temporal answer that is not its evidence Session's date, a multi-hop question whose
    evidence is not in two Sessions, too few Sessions or questions."""
    faults = []
    total = 0
    for conv in data["conversations"]:
        turns = {t["id"]: (s, t) for s in conv["sessions"] for t in s["turns"]}
        if len(conv["sessions"]) < 15:
            faults.append(f"{conv['id']}: {len(conv['sessions'])} Sessions")
        for q in conv["questions"]:
            total += 1
            missing = [e for e in q["evidence"] if e not in turns]
            if missing or not q["evidence"]:
                faults.append(f"{q['id']}: evidence {missing or 'none'}")
                continue
            found = [turns[e] for e in q["evidence"]]
            if q["category"] == "temporal":
                if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", q["answer"]) or q["answer"] != found[0][0]["date"]:
                    faults.append(f"{q['id']}: temporal answer {q['answer']} is not its Session's date")
            elif not any(q["answer"].casefold() in t["text"].casefold() for _, t in found):
                faults.append(f"{q['id']}: no evidence turn holds {q['answer']!r}")
            if q["category"] == "multi-hop" and len({s["session"] for s, _ in found}) < 2:
                faults.append(f"{q['id']}: multi-hop evidence in one Session")
    if len(data["conversations"]) < 8 or total < 300:
        faults.append(f"{len(data['conversations'])} conversations, {total} questions")
    return faults


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        problems = check(json.loads(OUT.read_text()))
        print("\n".join(problems) or "labels ok")
        sys.exit(1 if problems else 0)
    data = build()
    problems = check(data)
    if problems:
        sys.exit("\n".join(problems))
    OUT.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    counts: dict[str, int] = {}
    for conv in data["conversations"]:
        for q in conv["questions"]:
            counts[q["category"]] = counts.get(q["category"], 0) + 1
    print(f"{len(data['conversations'])} conversations, "
          f"{sum(len(c['sessions']) for c in data['conversations'])} Sessions, "
          f"{sum(len(s['turns']) for c in data['conversations'] for s in c['sessions'])} turns, "
          f"{sum(counts.values())} questions {counts}")
