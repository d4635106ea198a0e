"""Rewards to return from an agent: an LLM judge grading replies against a rubric (docs/rewards.md).

>>> import agentlightning_lite as agl
>>> judge = agl.rewards.Judge("Is the answer right?", base_url="http://127.0.0.1:8000/v1", model="judge")
>>> judge.parse("Score: 7/10")
0.7
"""

from .judge import Judge, JudgeParseError, JudgeUsage, parse_group, parse_score

__all__ = ["Judge", "JudgeParseError", "JudgeUsage", "parse_group", "parse_score"]
