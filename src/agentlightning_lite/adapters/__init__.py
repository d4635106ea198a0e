"""Framework adapters: record the runs of LangChain, OpenAI Agents SDK, AutoGen and CrewAI agents as spans.

Import the one you need (each imports its framework): ``adapters.langchain.LightningCallback``,
``adapters.openai_agents.LightningProcessor``, ``adapters.autogen`` (``LightningModelClient``,
``LightningEventHandler``), ``adapters.crewai.LightningListener``; each module also has a zero-code
``instrument()`` returning a handle whose ``uninstrument()`` undoes it. ``adapters.mcp.instrument()``
records the tool calls made to MCP servers through the ``mcp`` client SDK, by any of them or none.

>>> from agentlightning_lite.adapters import FRAMEWORKS
>>> FRAMEWORKS
('langchain', 'openai_agents', 'autogen', 'crewai')
"""

from ._common import Instrumentation, Recorder

FRAMEWORKS: tuple[str, ...] = ("langchain", "openai_agents", "autogen", "crewai")

__all__ = ["FRAMEWORKS", "Instrumentation", "Recorder"]
