-- bench/pipeline.lua: wrk script that writes DEPTH requests at once on each connection (wrk -s bench/pipeline.lua URL -- DEPTH, default 16).
-- wrk still counts and times every response on its own; the batch is sent again once all of it is answered.
init = function(args)
	local depth = tonumber(args[1]) or 16
	local one = wrk.format(nil, wrk.path)
	batch = string.rep(one, depth)
end

request = function()
	return batch
end
