"""The text formats agent and ranker must produce, named once for prompts, parsers and constrained decoding.

Agent turn:   <think> reasoning </think> then exactly one action:
              <search> sub-query </search>   or   <answer> short answer </answer>
Observation:  <information> the K chosen passages </information> (inserted by the rollout, never generated)
Ranker call:  <reason> short reason </reason> <ranking> [i] > [j] > ... (exactly K distinct ids) </ranking>
"""

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"
REASON_OPEN, REASON_CLOSE = "<reason>", "</reason>"
RANKING_OPEN, RANKING_CLOSE = "<ranking>", "</ranking>"

AGENT_STOPS = (SEARCH_CLOSE, ANSWER_CLOSE)
RANKER_STOPS = (RANKING_CLOSE,)
