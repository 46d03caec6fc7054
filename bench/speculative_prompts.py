"""The workloads of bench/speculative.py, fixed before any tuning of the speculation policy:
four copy-heavy agent turns (JSON extraction from a document, a ReAct turn quoting its
observation, a code edit of a given function, a tool call repeated across turns) and one
free-form story, each as chat messages for the model's template."""

DOCUMENT = """\
INVOICE 2026-0117
Seller: Northwind Traders Ltd., 14 Harbour Street, Bristol BS1 4QA, United Kingdom
Buyer: Lindqvist Marine AB, Skeppsbron 9, 111 30 Stockholm, Sweden
Date of issue: 3 November 2026. Payment due: 3 December 2026.
Items:
  1. Stainless steel deck cleat, 200 mm, part NW-4471, quantity 12, unit price EUR 18.40
  2. Braided mooring line, 16 mm x 15 m, part NW-2208, quantity 4, unit price EUR 64.90
  3. Bronze through-hull fitting, 1 inch, part NW-3310, quantity 6, unit price EUR 41.25
Subtotal EUR 728.90, VAT 25 percent EUR 182.23, total EUR 911.13.
Bank: Barclays, IBAN GB29 NWBK 6016 1331 9268 19, reference INV-2026-0117.
"""

EXTRACTION = [
    {"role": "system", "content": "You extract data from documents into JSON."},
    {"role": "user", "content": DOCUMENT + "\nExtract the invoice as JSON with the keys "
     "invoice_number, seller (name, address), buyer (name, address), date_of_issue, "
     "payment_due, items (a list of objects with description, part, quantity, unit_price), "
     "subtotal, vat, total, iban and reference. Copy every value exactly as written."},
]

REACT = [
    {"role": "system", "content": "You are a research agent. Answer with Thought, Action and "
     "Observation lines, and quote observations exactly."},
    {"role": "user", "content": "Question: When was the Golden Gate Bridge opened, and how "
     "long is its main span?"},
    {"role": "assistant", "content": "Thought: I should search for the bridge.\n"
     "Action: search[Golden Gate Bridge]"},
    {"role": "user", "content": "Observation: The Golden Gate Bridge is a suspension bridge "
     "spanning the Golden Gate, the one-mile-wide strait connecting San Francisco Bay and the "
     "Pacific Ocean. It opened to traffic on May 27, 1937 for pedestrians and on May 28, 1937 "
     "for vehicles. Its main span is 4,200 feet (1,280 m) long, and its towers rise 746 feet "
     "(227 m) above the water. It was the longest suspension bridge main span in the world "
     "until 1964.\n\nRepeat the observation you received word for word, then give the answer."},
]

CODE = '''def moving_average(values, window):
    """Return the moving averages of values over the given window."""
    if window <= 0:
        raise ValueError("window must be positive")
    result = []
    total = 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        if index >= window - 1:
            result.append(total / window)
    return result


def normalize(values):
    """Scale values so that they sum to one."""
    total = sum(values)
    if total == 0:
        raise ValueError("values sum to zero")
    return [value / total for value in values]
'''

CODE_EDIT = [
    {"role": "system", "content": "You are a careful programmer. Output complete code."},
    {"role": "user", "content": "Here is a Python module:\n\n```python\n" + CODE + "```\n\n"
     "Rename the parameter `values` to `samples` in both functions and keep everything else "
     "the same. Output the whole module."},
]

TOOL_CALLS = [
    {"role": "system", "content": "You call tools by writing one JSON object per line: "
     '{"tool": "get_weather", "arguments": {"city": ..., "unit": "celsius", "days": 3}}'},
    {"role": "user", "content": "Weather for Oslo, Bergen and Trondheim, please."},
    {"role": "assistant", "content": '{"tool": "get_weather", "arguments": {"city": "Oslo", '
     '"unit": "celsius", "days": 3}}\n{"tool": "get_weather", "arguments": {"city": "Bergen", '
     '"unit": "celsius", "days": 3}}\n{"tool": "get_weather", "arguments": {"city": '
     '"Trondheim", "unit": "celsius", "days": 3}}'},
    {"role": "user", "content": "Now the same for Stockholm, Gothenburg, Malmo, Uppsala, "
     "Copenhagen, Aarhus, Helsinki and Tampere."},
]

STORY = [
    {"role": "user", "content": "Write a long, original story about a lighthouse keeper who "
     "finds a strange map washed up on the shore."},
]

WORKLOADS = {"extraction": EXTRACTION, "react": REACT, "code_edit": CODE_EDIT,
             "tool_calls": TOOL_CALLS, "story": STORY}
COPY_HEAVY = ("extraction", "react", "code_edit", "tool_calls")
