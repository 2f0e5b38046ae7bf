"""OpenAI's front door: the Responses API (and, with it, the shapes its SDK expects) over
ordinary promptjobs prompts and jobs. A response is a prompt made here; its status is that
of the prompt's current job."""
