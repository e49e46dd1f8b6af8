"""Agent frameworks and client libraries against a running agentd (SPEC §17): the OpenAI
Agents SDK (its default, the Responses API, with a function tool), LangChain's ChatOpenAI
(Chat Completions, with a bound tool), LlamaIndex's OpenAILike and litellm. The configuration
each uses is the one docs/recipes.md gives. Run by tests/it/clients.rs with DEST/clients/py
(`frameworks`) or DEST/clients/lite (`libraries`) of scripts/install-test-peers.sh on
PYTHONPATH. Environment: AGENTD_BASE, AGENTD_TOKEN. Prints one JSON object per step.
"""

import json
import os

BASE = os.environ["AGENTD_BASE"]
TOKEN = os.environ["AGENTD_TOKEN"]


def out(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def agents_sdk():
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    @function_tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        return f"18 C and sunny in {city}"

    client = AsyncOpenAI(base_url=BASE + "/v1", api_key=TOKEN, max_retries=0)
    agent = Agent(name="weather", instructions="Answer with the tool.", tools=[get_weather],
                  model=OpenAIResponsesModel(model="agentd", openai_client=client))
    result = Runner.run_sync(agent, "clients weather agents")
    out("agents", text=result.final_output)


def langchain():
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="agentd", base_url=BASE + "/v1", api_key=TOKEN, max_retries=0)
    out("langchain", text=llm.invoke("clients hello langchain").content)

    @tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        return f"18 C and sunny in {city}"

    bound = llm.bind_tools([get_weather])
    msgs = [("user", "clients weather langchain")]
    ai = bound.invoke(msgs)
    calls = ai.tool_calls
    from langchain_core.messages import HumanMessage, ToolMessage
    history = [HumanMessage("clients weather langchain"), ai]
    for c in calls:
        history.append(ToolMessage(get_weather.invoke(c["args"]), tool_call_id=c["id"]))
    final = bound.invoke(history)
    out("langchain_tools", calls=[c["name"] for c in calls], text=final.content)


def llamaindex():
    from llama_index.llms.openai_like import OpenAILike

    llm = OpenAILike(model="agentd", api_base=BASE + "/v1", api_key=TOKEN,
                     is_chat_model=True, max_retries=0)
    out("llamaindex", text=str(llm.complete("clients hello llamaindex")))


def litellm_sdk():
    # The cost map ships with the package; without this litellm fetches it from GitHub.
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    import litellm

    r = litellm.completion(model="openai/agentd", api_base=BASE + "/v1", api_key=TOKEN,
                           messages=[{"role": "user", "content": "clients hello litellm"}])
    out("litellm", text=r.choices[0].message.content)


if __name__ == "__main__":
    import sys
    # Two installs (see scripts/install-test-peers.sh `clients`), one group each.
    if sys.argv[1] == "frameworks":
        agents_sdk()
        langchain()
    else:
        llamaindex()
        litellm_sdk()
