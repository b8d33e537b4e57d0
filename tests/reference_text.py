"""The reference provider's snapshot strings (dsh-memento 0.4.4 lib/strings.mjs), spelled out
once so the tests compare memoryd's output with them, not with memoryd's own constants."""

HEADER_EN = ("[dsh-memento: frozen memory snapshot — captured at session start; memory changes during this session "
             "do not update this block. To change memory, use the memory tool.]")
HEADER_ZH = "[dsh-memento：冻结记忆快照——会话启动时捕获；本会话内的记忆变更不更新此块。要修改记忆，请使用 memory 工具。]"
PROPOSALS_EN = ("## Pending memory proposals (reviewed by the user; approve or dismiss via the /memory proposals "
                "command)")
PROPOSALS_ZH = "## 待审批记忆提案（由用户裁决；用 /memory proposals 命令 approve 或 dismiss）"
