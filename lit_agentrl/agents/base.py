"""The agent-author contract: ``AgentGraph`` (a LangGraph workflow) producing an ``AgentGraphOutput``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from langchain_core.language_models.base import LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import Runnable
from pydantic import BaseModel, ConfigDict, Field, model_validator

from lit_agentrl.agents.chat_model import ChatModel, find_last_ai_index
from lit_agentrl.agents.config import cfg_get
from lit_agentrl.agents.drift import count_template_drift
from lit_agentrl.agents.multimodal import MULTI_MODAL_FIELD, openai_messages
from lit_agentrl.types import TokenSequence


class AgentGraphOutput(BaseModel):
    """One finished trajectory, token-exact.

    ``all_token_ids`` is ``prompt_ids`` followed by every token after it: generated tokens exactly as the
    engine returned them (``loss_mask`` 1) and tool/user turns encoded as the chat template renders them
    (``loss_mask`` 0). ``loss_mask`` and ``all_token_ids`` have the same length; the prompt carries 0.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    str_output: str
    """The decoded text after the prompt (generated and environment turns)."""
    prompt_ids: list[int]
    """Token ids of the initial prompt, chat template applied."""
    all_token_ids: list[int]
    """Prompt, generated and tool/user-turn token ids, in order."""
    loss_mask: list[int]
    """1 for tokens the model generated, 0 for the prompt and tool/user turns; len == len(all_token_ids)."""
    response_logprobs: list[float] | None = None
    """Engine log-probs aligned with ``all_token_ids[len(prompt_ids):]`` (0.0 where ``loss_mask`` is 0)."""
    reward_score: float | None = None
    """The agent's own (outcome) reward; when None, the configured reward function scores ``str_output``."""
    turn_rewards: list[float] | None = None
    """A reward per model turn of the main sequence, in order (an environment's step rewards), on top of the
    outcome: the trajectory's reward is the outcome plus their sum, and turn-level advantages
    (``model.loss.advantage``) credit each to its turn. Their number must equal the model turns' (runs of generated
    tokens in ``loss_mask``)."""
    num_turns: int = 0
    """Messages up to the last model turn: prompt, assistant and tool/user messages (as in the seed)."""
    extra_fields: dict[str, Any] = Field(default_factory=dict)
    """Anything else the agent wants to keep (``num_model_turns``, ``num_tool_calls`` are filled in)."""
    multi_modal_inputs: dict[str, Any] | None = None
    """A vision-language trajectory's images as the model takes them: ``{"pixel_values": [N, D],
    "image_grid_thw": [k, 3]}`` (every image of the conversation, in order); the training forward uses them.
    ``pixel_values=`` and ``image_grid_thw=`` (the seed's names) are accepted too and land here."""
    other_sequences: list[TokenSequence] = Field(default_factory=list)
    """Further token-exact sequences of the trajectory, when its model calls formed several contexts (a rewritten
    history, a sub-agent): trained beside the main one, each with the trajectory's advantage, or with its own
    ``reward`` under ``model.loss.sequence_rewards: own``."""
    pixel_values: Any = Field(default=None, exclude=True)
    image_grid_thw: Any = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _gather_images(self) -> AgentGraphOutput:
        """Fold the seed's ``pixel_values``/``image_grid_thw`` into :attr:`multi_modal_inputs` (and the other way)."""
        if self.multi_modal_inputs is None and self.pixel_values is not None:
            if self.image_grid_thw is None:
                raise ValueError("AgentGraphOutput: pixel_values without image_grid_thw")
            self.multi_modal_inputs = {"pixel_values": self.pixel_values, "image_grid_thw": self.image_grid_thw}
        if self.multi_modal_inputs is not None:
            missing = {"pixel_values", "image_grid_thw"} - set(self.multi_modal_inputs)
            if missing:
                raise ValueError(f"AgentGraphOutput.multi_modal_inputs lacks {sorted(missing)}")
            self.pixel_values = self.multi_modal_inputs["pixel_values"]
            self.image_grid_thw = self.multi_modal_inputs["image_grid_thw"]
        return self


MESSAGES_FIELD = "messages"
"""``extra_fields["messages"]``: the trajectory's conversation, moved to :attr:`Trajectory.messages`."""


class AgentGraph(ABC):
    """Base class of a registered agent: build a LangGraph graph, run it once per trajectory.

    Args:
        agent_name: the registry name the graph was built for.
        cfg: the YAML at the row's ``agent_cfg_path`` (``cfg.xxx``/``cfg["xxx"]``), None without one.
        llm: the rollout engine (SGLang's ``Engine`` API).
        tokenizer: the policy's tokenizer, with its chat template.
        processor: a vision-language policy's processor (the seed's signature); None for text models.
        model_type: ``"vlm"`` or ``"llm"`` (``self.model_type``), as the seed's framework names a vision-language
            and a text policy; by default ``"vlm"`` when there is a processor, else ``"llm"``.

    Subclasses implement :meth:`build_graph` and ``async run(messages, sampling_params, **kwargs)``; every
    field of the dataset row reaches ``run`` as a keyword argument (the ground truth also as
    ``ground_truth``). Example::

        @register("my_agent")
        class MyAgent(AgentGraph):
            def build_graph(self): ...
            async def run(self, messages, sampling_params, **kwargs) -> AgentGraphOutput: ...
    """

    required_fields: ClassVar[tuple[str, ...]] = ()
    """Row fields ``run`` needs (they reach it as keyword arguments): every row of the agent must have each, not
    null, or the data fails at setup naming the file, line and field. :meth:`row_errors` checks their values."""
    scores_itself: ClassVar[bool] = False
    """True for agents that always set ``reward_score`` (environments): their rows need no reward function and no
    ground truth, and none is checked at setup."""
    check_template_drift: bool = False
    """When True, :meth:`convert_agent_graph_output` records ``extra_fields["template_drift"]``."""
    chatmodel: Runnable[LanguageModelInput, AIMessage]
    """The graph's chat model (a :class:`ChatModel`, possibly with tools bound), made by :meth:`build_graph`."""

    def __init__(
        self,
        agent_name: str,
        cfg: Any,
        llm: Any,
        tokenizer: Any,
        processor: Any = None,
        model_type: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.agent_name = agent_name
        self.cfg = cfg
        self.llm = llm
        self.tokenizer = tokenizer
        self.processor = processor
        self.model_type = model_type if model_type is not None else ("llm" if processor is None else "vlm")
        self.kwargs = kwargs

    def make_chat_model(self) -> ChatModel:
        """A :class:`ChatModel` over this agent's engine and tokenizer (bind tools with ``.bind_tools``).

        The agent YAML's ``chat_template`` (a Jinja string), when set, renders this agent's conversations instead of
        the tokenizer's or processor's own: e.g. a template that lists tools, for a model whose own does not
        (Qwen2.5-VL's). Token-exactness and the drift check use it too; other agents keep the model's template.
        """
        template_kwargs: dict[str, Any] = {"enable_thinking": False}
        chat_template = cfg_get(self.cfg, "chat_template", None)
        if chat_template is not None:
            if not isinstance(chat_template, str) or "{" not in chat_template:
                raise ValueError(f"agent {self.agent_name!r}: cfg.chat_template must be a Jinja template string")
            template_kwargs["chat_template"] = chat_template
        return ChatModel(
            model=self.agent_name,
            llm=self.llm,
            tokenizer=self.tokenizer,
            processor=self.processor,
            model_type=self.model_type,
            chat_template_kwargs=template_kwargs,
        )

    def build_graph(self) -> Any:
        """Build the LangGraph workflow; the base version only makes ``self.chatmodel``."""
        self.chatmodel = self.make_chat_model()

    @abstractmethod
    async def run(self, messages: Sequence[Any], sampling_params: Mapping[str, Any], **kwargs: Any) -> AgentGraphOutput:
        """Produce one trajectory for one dataset row."""

    @classmethod
    def row_errors(cls, row: Mapping[str, Any]) -> list[str]:
        """What is wrong with a dataset row for this agent, each naming the field; checked for every row at setup.

        Override to check the extra fields ``run`` needs, so bad data fails before the first step, not as failed
        trajectories in the middle of a run.
        """
        return []

    def convert_agent_graph_output(self, state: Mapping[str, Any] | Sequence[BaseMessage]) -> AgentGraphOutput:
        """Turn a finished LangGraph state (``{"messages": [...]}``) into an :class:`AgentGraphOutput`.

        Messages after the last model turn (e.g. a final tool answer) are not part of the trajectory.
        """
        messages = list(state["messages"] if isinstance(state, Mapping) else state)
        last = find_last_ai_index(messages)
        if last < 0:
            raise ValueError(f"agent {self.agent_name!r}: the graph finished without any model turn")
        meta = messages[last].response_metadata
        prompt_len = meta["prompt_length"]
        ai_messages = [m for m in messages[: last + 1] if isinstance(m, AIMessage)]
        extra: dict[str, Any] = {
            "num_model_turns": len(ai_messages),
            "num_tool_calls": sum(len(m.tool_calls) + len(m.invalid_tool_calls) for m in ai_messages),
            "finish_reason": meta.get("finish_reason"),
            # The conversation as OpenAI-style dicts (role, content, tool_calls), for the trajectory log and viewer.
            MESSAGES_FIELD: openai_messages(messages[: last + 1]),
        }
        if self.check_template_drift:
            extra["template_drift"] = count_template_drift(
                messages, self.tokenizer, meta.get("tools"), meta.get("chat_template_kwargs"), self.processor
            )
        return AgentGraphOutput(
            str_output=self.tokenizer.decode(meta["token_ids"][prompt_len:]),
            prompt_ids=list(meta["token_ids"][:prompt_len]),
            all_token_ids=list(meta["token_ids"]),
            loss_mask=list(meta["loss_mask"]),
            response_logprobs=list(meta["logprobs"][prompt_len:]),
            num_turns=last + 1,
            extra_fields=extra,
            multi_modal_inputs=meta.get(MULTI_MODAL_FIELD),
        )


BaseAgentGraph = AgentGraph
