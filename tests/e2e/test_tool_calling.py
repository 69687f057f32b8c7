"""Tool calling on chat completions, with the official clients (the openai SDK, LangChain's
ChatOpenAI, the OpenAI Agents SDK) against a live llmq and the embedded model. A forced call
(required, or a named function) is enforced by the engine's structured output, so even this tiny
model makes a call whose arguments are valid for its schema."""
import asyncio

import openai
import pytest

from tests.support.tool_calls import ALL_CHECKS, ASK, NAMED, TIME, WEATHER

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def client(live_api):
    return openai.OpenAI(base_url=f"{live_api}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module", params=["default", "hf"])
def engine_client(request):
    """The shared stack's engine (OpenVINO where it is installed), then the reference engine's
    shared stack (vLLM's module runs the same checks on its own stack)."""
    url = request.getfixturevalue("live_api") if request.param == "default" else request.getfixturevalue("hf_stack")[1]
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda check: check.__name__)
def test_tool_calls_on_each_engine(engine_client, check):
    check(engine_client, MODEL)


def test_tool_requests_that_cannot_work_are_400s_naming_why(client):
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[TIME], tool_choice=NAMED)
    with pytest.raises(openai.BadRequestError, match="tool_call_id"):
        client.chat.completions.create(model=MODEL, messages=[*ASK, {"role": "tool", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="functions"):
        client.chat.completions.create(model=MODEL, messages=ASK, functions=[WEATHER["function"]])


def test_langchain_bind_tools_returns_tool_calls(live_api):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    llm = ChatOpenAI(model=MODEL, base_url=f"{live_api}/v1", api_key="unused", temperature=0, max_tokens=40,
                     max_retries=0)
    message = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Paris?")
    [call] = message.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)


def test_an_agents_sdk_runner_calls_its_tool_through_responses(live_api):
    from agents import (Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner, function_tool,
                        set_tracing_disabled)

    set_tracing_disabled(True)  # the SDK's traces go to OpenAI's servers otherwise
    seen = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"It is sunny in {city}."

    model = OpenAIResponsesModel(model=MODEL, openai_client=openai.AsyncOpenAI(
        base_url=f"{live_api}/v1", api_key="unused", max_retries=0))
    agent = Agent(name="weather", instructions="Answer with the weather tool.", tools=[get_weather], model=model,
                  model_settings=ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=40),
                  tool_use_behavior="stop_on_first_tool")
    result = Runner.run_sync(agent, "What is the weather in Paris?", run_config=RunConfig(tracing_disabled=True))
    assert len(seen) == 1 and result.final_output == f"It is sunny in {seen[0]}."

    async def streamed():  # the same run over a Responses stream
        run = Runner.run_streamed(agent, "What is the weather in Oslo?", run_config=RunConfig(tracing_disabled=True))
        kinds = [event.type async for event in run.stream_events()]
        return run.final_output, kinds

    output, kinds = asyncio.run(streamed())
    assert len(seen) == 2 and output == f"It is sunny in {seen[1]}." and "raw_response_event" in kinds


def test_a_jobs_api_job_with_tools_shows_its_calls(live_api):
    import requests

    from tests.support.waiting import wait_for_job

    reply = requests.post(f"{live_api}/v1/jobs", json={"messages": ASK, "tools": [WEATHER], "tool_choice": NAMED,
                                                       "max_tokens": 40, "temperature": 0}, timeout=30)
    assert reply.status_code in (200, 202), reply.text
    job = wait_for_job(live_api, reply.json()["id"])
    [call] = job["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["function"]["arguments"] == job["text"]
