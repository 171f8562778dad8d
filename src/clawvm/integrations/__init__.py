"""Framework integrations, each an optional extra (``pip install clawvm[integrations]``).

- :mod:`clawvm.integrations.langchain`: a LangChain callback handler recording tool calls and LLM outputs;
- :mod:`clawvm.integrations.langgraph`: a LangGraph ``BaseStore`` backed by ClawVM;
- :mod:`clawvm.integrations.mcp_server`: an MCP server exposing the agent tools (:mod:`clawvm.agents.tools`).

Import the module you need; nothing here imports the frameworks.
"""
