"""Training prompts that are NOT from any evaluation set: derived from the Python standard library's own
signatures and docstrings (coding, explanations) plus templated maths and everyday requests.

Deterministic for a seed, so the data set can be regenerated exactly. The first V1 = 8,000 prompts are the
original mix (the shipped drafter's data); prompts past them add two kinds its acceptance lacked: bare code stubs
to complete (a stdlib signature and docstring as a Python function, the shape of HumanEval's prompts) and
open-ended requests (role-play, extraction, reasoning, the kinds MT-Bench asks), with the original mix between.
"""
from __future__ import annotations

import importlib
import inspect
import random

STDLIB = ["string", "math", "statistics", "itertools", "functools", "collections", "heapq", "bisect", "re",
          "json", "csv", "datetime", "calendar", "textwrap", "difflib", "fractions", "decimal", "random",
          "os.path", "pathlib", "shutil", "glob", "fnmatch", "hashlib", "base64", "binascii", "zlib", "gzip",
          "struct", "array", "copy", "pprint", "enum", "dataclasses", "typing", "operator", "html", "urllib.parse",
          "ipaddress", "uuid", "secrets", "time", "locale", "unicodedata", "shlex", "argparse", "logging",
          "sqlite3", "tempfile", "zipfile", "tarfile", "configparser", "contextlib", "abc", "numbers", "cmath",
          "colorsys", "graphlib", "queue", "threading", "subprocess", "socket", "email.utils", "wave", "codecs"]

CODE_TEMPLATES = [
    "Write a Python function `{name}{sig}` that {summary}",
    "Implement `{name}` in pure Python without importing `{module}`. It should behave like this: {summary}",
    "Explain what `{module}.{name}` does, with a short example: {summary}",
    "Write unit tests with pytest for a function `{name}{sig}` that {summary}",
    "Show how to use `{module}.{name}` to solve a practical problem. Its documentation says: {summary}",
    "Rewrite the following idea as a clear, commented Python function: {summary}",
]

TASKS = [
    "reverse the words in a sentence", "count the vowels in a string", "check whether a number is prime",
    "merge two sorted lists", "flatten a nested list", "compute the n-th Fibonacci number iteratively",
    "remove duplicates from a list while keeping order", "find the longest common prefix of strings",
    "convert a Roman numeral to an integer", "validate an email address with a regular expression",
    "parse a CSV line into fields", "compute the median of a list", "rotate a matrix by 90 degrees",
    "group words that are anagrams", "find all pairs in a list that sum to a target",
    "implement binary search", "implement a stack class with push, pop and peek",
    "read a text file and count word frequencies", "convert Celsius to Fahrenheit for a list of values",
    "check whether brackets in a string are balanced", "compute the greatest common divisor",
    "generate all permutations of a string", "implement a least-recently-used cache",
    "compress a string with run-length encoding", "find the second largest number in a list",
    "transpose a list of lists", "return the digits of an integer as a list", "implement bubble sort",
    "find the first non-repeating character", "sum the numbers in a nested dictionary",
]

TASK_TEMPLATES = ["Write a Python function to {t}.", "How do I {t} in Python?", "Write a JavaScript function to {t}.",
                  "Write a C function to {t}.", "Explain step by step how to {t}, then give Python code.",
                  "Give a short, efficient Python solution to {t} and state its time complexity."]

TOPICS = ["photosynthesis", "the water cycle", "compound interest", "how vaccines work", "black holes",
          "the French Revolution", "machine learning", "climate change", "the stock market", "volcanoes",
          "the human heart", "electric cars", "the Roman Empire", "plate tectonics", "recycling",
          "sleep and memory", "the internet", "inflation", "renewable energy", "the immune system",
          "democracy", "gravity", "the printing press", "honeybees", "nutrition", "time zones",
          "quantum computing", "the moon landing", "coral reefs", "supply and demand"]

EVERYDAY = ["Explain {topic} to a ten-year-old.", "Write a short essay about {topic}.",
            "Give me five interesting facts about {topic}.", "What are the pros and cons of {topic}?",
            "Summarize the history of {topic} in a paragraph.", "Write a short poem about {topic}.",
            "Write a blog post introduction about {topic}.", "Create a quiz with three questions about {topic}.",
            "Write an email to a friend recommending a book about {topic}.",
            "Describe a common misconception about {topic} and correct it."]

ERRANDS = ["Plan a three-day trip to {city}.", "Write a polite email asking my manager for a day off.",
           "Suggest a weekly workout plan for a beginner.", "Give me a recipe for a quick vegetarian dinner.",
           "How can I improve my time management?", "Write a cover letter for a junior {job} position.",
           "What should I pack for a weekend camping trip?", "Give tips for a job interview as a {job}.",
           "Draft a short speech for a friend's birthday.", "How do I start learning to play the guitar?",
           "Write a product description for a reusable water bottle.", "Suggest names for a new {job} startup."]
CITIES = ["Paris", "Tokyo", "Lisbon", "New York", "Cairo", "Sydney", "Toronto", "Rome", "Seoul", "Mexico City"]
JOBS = ["data analyst", "software engineer", "nurse", "teacher", "designer", "accountant", "chef", "mechanic"]


def _stdlib_items():
    items = []
    for modname in STDLIB:
        try:
            mod = importlib.import_module(modname)
        except Exception:
            continue
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.isclass(obj)):
                continue
            doc = inspect.getdoc(obj) or ""
            summary = " ".join(doc.split("\n\n")[0].split())
            if len(summary) < 20 or len(summary) > 400:
                continue
            try:
                sig = str(inspect.signature(obj))
            except (TypeError, ValueError):
                sig = "(...)"
            items.append((modname, name, sig, summary))
    return items


def _maths(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 20)
    forms = [f"A shop sells pens for ${c} each. Sara buys {a} pens and pays with ${a * c + b}. How much change "
             f"does she get? Explain your reasoning.",
             f"Solve for x: {c}x + {a} = {b + a * c}. Show each step.",
             f"What is {a} percent of {b * 10}? Explain how to compute it.",
             f"A train travels {a * 10} km in {c} hours. What is its average speed?",
             f"Compute the area and perimeter of a rectangle that is {a} cm by {b} cm.",
             f"Is {a * b + 1} a prime number? Explain.",
             f"Simplify the fraction {a * c}/{b * c} and explain the steps.",
             f"If a recipe needs {c} eggs for {a} cookies, how many eggs are needed for {a * 3} cookies?"]
    return rng.choice(forms)


V1 = 8000

ROLES = ["a travel guide", "a chess coach", "a detective", "a nutritionist", "a history teacher", "a startup founder",
         "a park ranger", "a librarian", "a pirate captain", "a museum curator"]
OPEN = ["Pretend you are {role}. Introduce yourself and answer: what is the most common mistake people make?",
        "As {role}, write a short letter to a newcomer with three pieces of advice.",
        "Extract every number and what it refers to from this text: \"{fact}\" Answer as a JSON list.",
        "Read this sentence and list the people, places and dates it mentions: \"{fact}\"",
        "Compare {topic} and {topic2}: give two similarities and two differences.",
        "A friend claims that {topic} is overrated. Write a respectful counter-argument in one paragraph.",
        "Explain {topic} in exactly three sentences, then give one follow-up question a student might ask.",
        "Rewrite this in a formal tone: \"hey, {topic} is kinda cool, you should check it out sometime\"",
        "Think step by step: if {a} people each shake hands with everyone else once, how many handshakes are there?",
        "Write a dialogue of six lines between {role} and a customer about {topic}."]
FACTS = ["In 1969, 3 astronauts flew to the Moon aboard Apollo 11, and 2 of them walked on its surface.",
         "The bakery on Main Street sold 240 loaves on Monday and 315 on Tuesday, at 3 dollars each.",
         "Marie Curie won the Nobel Prize in Physics in 1903 and in Chemistry in 1911, in Paris.",
         "The marathon in Berlin had 45000 runners; the winner finished in 2 hours and 1 minute.",
         "Our team of 12 engineers shipped 4 releases in 2023 and cut latency by 35 percent."]


def _stub(name: str, sig: str, summary: str) -> str | None:
    """A stdlib signature and docstring as a function to complete, or None when the signature is not Python."""
    text = f'def {name}{sig}:\n    """{summary}\n    """\n'
    try:
        compile(text + "    pass\n", "<stub>", "exec")
    except SyntaxError:
        return None
    return text


# how a benchmark or a user hands over a function to complete (the first is the z-lab HumanEval instruction)
STUB_TEMPLATES = ["Write a solution to the following problem and make sure that it passes the tests:\n"
                  "```python\n{stub}\n```",
                  "Complete the following Python function:\n```python\n{stub}```",
                  "Finish this function; keep its signature and docstring:\n```python\n{stub}```",
                  "{stub}"]


def _later(rng: random.Random, items) -> tuple[str, str] | None:
    r = rng.random()
    if r < 0.4 and items:
        m, name, sig, summary = rng.choice(items)
        text = _stub(name, sig, summary)
        return (rng.choice(STUB_TEMPLATES).format(stub=text), "code-stub") if text else None
    if r < 0.7:
        t1, t2 = rng.sample(TOPICS, 2)
        return rng.choice(OPEN).format(role=rng.choice(ROLES), fact=rng.choice(FACTS), topic=t1, topic2=t2,
                                       a=rng.randint(3, 30)), "open"
    return None  # the original mix


def make_prompts(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    items = _stdlib_items()
    out, seen = [], set()
    later = random.Random(seed + 1)  # past V1 only: the first V1 prompts never change
    while len(out) < n:
        if len(out) >= V1:
            got = _later(later, items)
            if got is not None:
                text, kind = got
                if text not in seen:
                    seen.add(text)
                    out.append({"id": len(out), "kind": kind, "prompt": text})
                continue
        r = rng.random()
        if r < 0.35 and items:
            m, name, sig, summary = rng.choice(items)
            text = rng.choice(CODE_TEMPLATES).format(module=m, name=name, sig=sig, summary=summary)
            kind = "code-stdlib"
        elif r < 0.55:
            text, kind = rng.choice(TASK_TEMPLATES).format(t=rng.choice(TASKS)), "code-task"
        elif r < 0.7:
            text, kind = _maths(rng), "maths"
        elif r < 0.88:
            text, kind = rng.choice(EVERYDAY).format(topic=rng.choice(TOPICS)), "explain"
        else:
            text = rng.choice(ERRANDS).format(city=rng.choice(CITIES), job=rng.choice(JOBS))
            kind = "everyday"
        if text in seen:
            continue
        seen.add(text)
        out.append({"id": len(out), "kind": kind, "prompt": text})
    return out
