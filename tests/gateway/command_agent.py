"""An agent as a separate program, the way users run one: the official client reads OPENAI_BASE_URL and
OPENAI_API_KEY from the environment; the row arrives on stdin; the reward goes out as the last line."""

import json
import sys

import openai

row = json.load(sys.stdin)
client = openai.OpenAI()
reply = client.chat.completions.create(model="policy", messages=row["messages"])
answer = reply.choices[0].message.content or ""
print("the model said:", answer)
print(json.dumps({"reward": float(row["ground_truth"] in answer), "metrics": {"chars": len(answer)}}))
